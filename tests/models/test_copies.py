"""A prepared model copied or wrapped keeps its examples apart with its own layers: deep copies, state dicts,
PEFT in either order, enable_packing on the base model first. Tiny float32 hybrids on the CPU.

What a deep copy must do (TRL's reference model, EMA, "keep a frozen copy"): run its own weights,
get its own gradients, and not move when the original trains; its probe must probe it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _hybrids import HYBRIDS, alone_logits, examples_for, tiny_hybrid

from packing_collators import FlatteningCollator, check_packing_support, enable_packing
from packing_collators.checks import probe_packing
from packing_collators.models import find_stateful_layers, packing_layers

TYPES = [t for t in ("qwen3_5_text", "lfm2") if t in HYBRIDS]
QWEN = "qwen3_5_text" if "qwen3_5_text" in HYBRIDS else sorted(HYBRIDS)[0]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1.0))


def _batch(model, lengths=(7, 12, 5, 9), seed=0) -> dict:
    return FlatteningCollator()(examples_for(model, lengths, seed=seed))


def _moved(model, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))


@pytest.mark.parametrize("model_type", TYPES)
def test_a_deep_copy_runs_its_own_weights_and_gets_its_own_gradients(model_type):
    # Before: the copy's layers ran the original's (1.55 relative in these logits; no gradient for A_log).
    model = enable_packing(tiny_hybrid(model_type))
    clone = copy.deepcopy(model)
    _moved(clone)
    fresh = enable_packing(tiny_hybrid(model_type))
    fresh.load_state_dict(clone.state_dict())
    batch = _batch(model)
    for m in (clone, fresh):
        m.train()
        m(**batch).loss.backward()
    assert _relative(clone(**batch).logits, fresh(**batch).logits) < 1e-6
    grads = {name: p.grad for name, p in fresh.named_parameters()}
    for name, p in clone.named_parameters():
        assert (p.grad is None) == (grads[name] is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, grads[name], msg=name)
    assert all(p.grad is None for p in model.parameters())  # the original took no part
    with torch.no_grad():
        clone.eval()
        assert _relative(clone(**batch).logits[0], alone_logits(clone, examples_for(clone))) < 1e-5


def test_a_frozen_copy_does_not_move_when_the_original_steps():
    # Before: after one SGD step on the original, the frozen copy's logits moved by 5.49.
    model = enable_packing(tiny_hybrid(QWEN))
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    batch = _batch(model)
    with torch.no_grad():
        before = reference(**batch).logits
    model.train()
    model(**batch).loss.backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    with torch.no_grad():
        assert torch.equal(reference(**batch).logits, before)


def test_the_probe_of_a_copy_runs_the_copy():
    # Before: the copy ran the original's layers, so poisoning the original failed the copy's probe (NaN).
    model = enable_packing(tiny_hybrid(QWEN))
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for _, layer in find_stateful_layers(model):
            for p in layer.parameters():
                p.fill_(float("nan"))
    report = probe_packing(clone)
    assert report.passed, report.summary()
    assert check_packing_support(clone, _batch(clone)) == "sdpa"


def test_a_state_dict_round_trip_keeps_the_keys_and_the_packed_logits():
    prepared = enable_packing(tiny_hybrid(QWEN))
    _moved(prepared)
    plain = tiny_hybrid(QWEN, seed=3)
    assert list(prepared.state_dict()) == list(plain.state_dict())  # nothing of enable_packing is saved
    plain.load_state_dict(prepared.state_dict())
    other = enable_packing(tiny_hybrid(QWEN, seed=4))
    other.load_state_dict(enable_packing(plain).state_dict())
    batch = _batch(prepared)
    with torch.no_grad():
        expected = prepared(**batch).logits
        assert torch.equal(plain(**batch).logits, expected)
        assert torch.equal(other(**batch).logits, expected)


def test_enable_packing_on_the_base_model_first_is_accepted_and_not_wrapped_twice():
    # Before: check_packing_support refused the model, and enable_packing(model) then wrapped every stateful
    # layer a second time (every packed batch raised a RuntimeError).
    model = tiny_hybrid(QWEN)
    enable_packing(model.model)
    batch = _batch(model)
    assert check_packing_support(model, batch) == "sdpa"
    forwards = [layer.forward for _, layer in find_stateful_layers(model)]
    enable_packing(model)
    assert [layer.forward for _, layer in find_stateful_layers(model)] == forwards
    assert packing_layers(model).counts == packing_layers(model.model).counts
    with torch.no_grad():
        assert _relative(model(**batch).logits[0], alone_logits(model, examples_for(model))) < 1e-5


def test_a_deep_copy_of_a_vision_language_model_numbers_its_own_positions():
    # Before: the copy's positions hook read a state its boundaries hook never wrote: its examples mixed (the
    # probe refused it, blaming "a layer kind it does not know").
    from _vlms import alone_logits as vlm_alone_logits
    from _vlms import available, mixed_examples, tiny_vlm

    if not available():
        pytest.skip("this transformers has none of the VLM types")
    model = enable_packing(tiny_vlm("qwen2_5_vl" if "qwen2_5_vl" in available() else available()[0]))
    clone = copy.deepcopy(model)
    _moved(clone)
    examples = mixed_examples(clone.config)
    batch = FlatteningCollator()(examples)
    batch.pop("labels")
    with torch.no_grad():
        assert _relative(clone(**batch).logits[0], vlm_alone_logits(clone, examples)) < 1e-5
    clone.config.use_cache = False
    assert probe_packing(clone).passed


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_deep_copy_of_a_checkpointed_model_recomputes_its_own_layers(reentrant):
    """A copy made after a checkpointed training forward (the recompute wrappers installed) recomputes in its own
    scopes: two packed forwards before one backward give the gradients of the same copy without checkpointing."""
    model = enable_packing(tiny_hybrid(QWEN).train())
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model(**_batch(model)).loss.backward()  # installs the wrappers
    model.zero_grad(set_to_none=True)
    clone = copy.deepcopy(model)
    _moved(clone)
    plain = copy.deepcopy(clone)
    plain.gradient_checkpointing_disable()
    first, second = _batch(model, (7, 12, 5), seed=0), _batch(model, (5, 12, 7), seed=1)
    for m in (clone, plain):
        (m(**first).loss + m(**second).loss).backward()
    assert all(p.grad is None for p in model.parameters())
    for (name, p), (_, q) in zip(clone.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6 * float(q.grad.abs().max()) + 1e-8, msg=name)


def test_a_pickled_model_loads_prepared(tmp_path):
    # Before: torch.save(model) failed: the layers' forwards were closures, which pickle cannot save.
    model = enable_packing(tiny_hybrid(QWEN))
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    batch = _batch(model)
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, model(**batch).logits)
        _moved(loaded)
        fresh = enable_packing(tiny_hybrid(QWEN))
        fresh.load_state_dict(loaded.state_dict())
        assert _relative(loaded(**batch).logits, fresh(**batch).logits) < 1e-6  # its own layers, its own weights
    assert packing_layers(loaded).counts == packing_layers(model).counts
