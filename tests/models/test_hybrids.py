"""enable_packing on hybrid models: a packed row gives every example the logits (and gradients) it gets alone.

Every hybrid causal LM of the installed transformers that builds tiny (``tests/_hybrids.py``), float32
on the CPU, through the path a CPU takes (each stateful layer run per example); a Granite-4.0-H with
an attention layer (whose own mask ignores the packed positions) under sdpa and eager; gradient
checkpointing, reentrant and not; ``PrePackedCollator`` rows, flat and padded.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _hybrids import HYBRIDS, alone_logits, examples_for, tiny_hybrid

from packing_collators import FlatteningCollator, PrePackedCollator, enable_packing
from packing_collators.models import find_stateful_layers, packing_layers


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1.0))


def _packed_inputs(examples, collator=None) -> dict:
    batch = (collator or FlatteningCollator())(examples)
    batch.pop("labels", None)
    return batch


def _naive(model, examples) -> torch.Tensor | None:
    """The packed row's logits before enable_packing, or None where transformers refuses the row itself."""
    try:
        return model(**_packed_inputs(examples)).logits[0]
    except ValueError as error:  # transformers >= 5.2x: "can't keep packed sequences apart without ..."
        assert "packed" in str(error)
        return None


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_packed_logits_equal_each_example_alone(model_type):
    model = tiny_hybrid(model_type)
    examples = examples_for(model)
    assert find_stateful_layers(model), f"{model_type}: no stateful layer found"
    with torch.no_grad():
        alone = alone_logits(model, examples)
        naive = _naive(model, examples)
        enable_packing(model)
        packed = model(**_packed_inputs(examples)).logits[0]
    assert _relative(packed, alone) < 1e-5
    if naive is not None:  # packing without it is wrong (some transformers versions raise instead)
        assert _relative(naive, alone) > 1e-3


@pytest.mark.skipif("granitemoehybrid" not in HYBRIDS, reason="this transformers has no Granite-4.0-H")
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_granite_attention_layer_sees_only_its_example(attn):
    model = tiny_hybrid("granitemoehybrid", attn=attn)
    assert "full_attention" in model.config.layer_types
    examples = examples_for(model)
    with torch.no_grad():
        alone = alone_logits(model, examples)
        enable_packing(model)
        packed = model(**_packed_inputs(examples)).logits[0]
    assert _relative(packed, alone) < 1e-5
    assert packing_layers(model).counts["attention"] == 1


def _weighted_sum(logits: torch.Tensor, seed: int = 1) -> torch.Tensor:
    weights = torch.randn(logits.shape[-2:], generator=torch.Generator().manual_seed(seed))
    return (logits.reshape(-1, logits.shape[-1]) * weights).sum()


GRADIENT_TYPES = [t for t in ("qwen3_5_text", "nemotron_h", "granitemoehybrid", "lfm2") if t in HYBRIDS]


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("model_type", GRADIENT_TYPES)
def test_gradients_equal_each_example_alone_under_gradient_checkpointing(model_type, reentrant):
    reference = tiny_hybrid(model_type).train()
    examples = examples_for(reference)
    _weighted_sum(alone_logits(reference, examples)).backward()
    model = enable_packing(tiny_hybrid(model_type).train())
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    _weighted_sum(model(**_packed_inputs(examples)).logits).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if q.grad is None:
            assert p.grad is None or not p.grad.any(), name
            continue
        assert p.grad is not None, f"{name}: no gradient through the checkpointed packed forward"
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * float(q.grad.abs().max()) + 1e-7, msg=name)


@pytest.mark.parametrize("mode", ["flatten", "pad"])
def test_prepacked_rows(mode):
    model = tiny_hybrid("nemotron_h" if "nemotron_h" in HYBRIDS else sorted(HYBRIDS)[0])
    examples = examples_for(model, (7, 12, 5, 9, 3))
    rows = [
        {"input_ids": sum((e["input_ids"] for e in group), []), "seq_lengths": [len(e["input_ids"]) for e in group]}
        for group in (examples[:2], examples[2:])
    ]
    batch = _packed_inputs(rows, PrePackedCollator(mode=mode, max_length=20) if mode == "pad" else PrePackedCollator())
    with torch.no_grad():
        alone = alone_logits(model, examples)
        enable_packing(model)
        logits = model(**batch).logits
    if mode == "pad":  # rows of 19 and 17 tokens, padded to 20
        real = torch.cat([logits[0, :19], logits[1, :17]])
    else:
        real = logits[0]
    assert _relative(real, alone) < 1e-5


def test_enable_packing_is_idempotent_and_returns_the_model():
    model = tiny_hybrid("qwen3_5_text" if "qwen3_5_text" in HYBRIDS else sorted(HYBRIDS)[0])
    assert enable_packing(model) is model
    forwards = [layer.forward for _, layer in find_stateful_layers(model)]
    hooks = {name: len(m._forward_pre_hooks) + len(m._forward_hooks) for name, m in model.named_modules()}
    enable_packing(model)
    assert [layer.forward for _, layer in find_stateful_layers(model)] == forwards
    assert all(f.original is None for f in forwards)  # each wraps the layer's own forward, not another wrapper
    assert {name: len(m._forward_pre_hooks) + len(m._forward_hooks) for name, m in model.named_modules()} == hooks


def test_a_layer_called_with_another_batch_is_refused():
    """Inside a call of the model a layer's examples are that call's: hidden states of another shape are refused.
    Outside any call the scope is closed, and the layer is its own forward (one sequence per row)."""
    model = enable_packing(tiny_hybrid("nemotron_h" if "nemotron_h" in HYBRIDS else sorted(HYBRIDS)[0]))
    examples = examples_for(model)
    name, layer = find_stateful_layers(model)[0]
    other = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(0))
    handle = model.lm_head.register_forward_pre_hook(lambda module, args: layer(other))
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"called with hidden states \(1, 5, 32\) inside a call"):
        model(**_packed_inputs(examples))
    handle.remove()
    with torch.no_grad():
        assert torch.equal(layer(other), type(layer).forward(layer, other))  # the call that raised closed its scope
        model(**_packed_inputs(examples))
        assert torch.equal(layer(other), type(layer).forward(layer, other))


def test_an_unpacked_batch_runs_the_layers_unchanged():
    model = tiny_hybrid("qwen3_5_text" if "qwen3_5_text" in HYBRIDS else sorted(HYBRIDS)[0])
    ids = torch.tensor([examples_for(model, (9,))[0]["input_ids"]] * 2)
    with torch.no_grad():
        before = model(input_ids=ids).logits
        after = enable_packing(model)(input_ids=ids).logits
    assert torch.equal(before, after)


def test_models_without_stateful_layers_are_left_alone():
    from _tiny_models import tiny_model

    model = tiny_model("llama")
    ids = torch.tensor([examples_for(model, (9,))[0]["input_ids"]] * 2)
    with torch.no_grad():
        before = model(input_ids=ids).logits
    assert find_stateful_layers(model) == []
    layers = packing_layers(enable_packing(model))
    assert layers.paths == {} and layers.counts == {} and layers.multimodal is None
    assert not any(m._forward_pre_hooks or m._forward_hooks or "forward" in m.__dict__ for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)  # nothing installed: nothing for compile to trace
    assert layers.summary().startswith("no layer carries state")


GATED_DELTANET = [t for t in ("qwen3_5_text", "qwen3_next", "qwen3_5_moe_text") if t in HYBRIDS]


@pytest.mark.parametrize("model_type", GATED_DELTANET)
def test_the_varlen_gated_deltanet_path_computes_the_layer(model_type):
    """The varlen path's wiring (projections, heads, conv, gates, norm), with reference kernels on the CPU,
    against the layer's own forward per example: outputs and gradients."""
    from _gdn_reference import REFERENCE

    from packing_collators.models._enable import enable_packing_with

    reference = enable_packing(tiny_hybrid(model_type).train())
    model = enable_packing_with(tiny_hybrid(model_type).train(), lambda: (REFERENCE, ""))
    assert "reference varlen kernels on cpu" in packing_layers(model).summary()
    examples = examples_for(model)
    losses = []
    for m in (reference, model):
        logits = m(**_packed_inputs(examples)).logits
        _weighted_sum(logits).backward()
        losses.append(logits)
    assert _relative(losses[1], losses[0]) < 1e-5
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if q.grad is not None:
            torch.testing.assert_close(
                p.grad, q.grad, rtol=1e-4, atol=1e-5 * float(q.grad.abs().max()) + 1e-7, msg=name
            )


def test_an_fla_without_cu_seqlens_falls_back_with_a_warning_naming_the_version(monkeypatch, caplog):
    """A kernel package too old for varlen: the exact per-example path, and a warning that names the version."""
    import sys
    import types

    old = types.ModuleType("fla.ops.gated_delta_rule")
    old.chunk_gated_delta_rule = lambda q, k, v, g, beta, initial_state=None: None  # no cu_seqlens
    conv = types.ModuleType("fla.modules.causal_conv1d")
    conv.causal_conv1d = lambda x, weight=None, bias=None, activation=None: None
    model = tiny_hybrid(GATED_DELTANET[0] if GATED_DELTANET else sorted(HYBRIDS)[0])
    with monkeypatch.context() as patch, caplog.at_level("WARNING", logger="packing_collators"):
        for name, module in {"fla": types.ModuleType("fla"), "fla.ops": types.ModuleType("fla.ops"),
                             "fla.ops.gated_delta_rule": old, "fla.modules": types.ModuleType("fla.modules"),
                             "fla.modules.causal_conv1d": conv}.items():  # fmt: skip
            patch.setitem(sys.modules, name, module)
        enable_packing(model)
    assert "install flash-linear-attention>=0.6.0 for the varlen kernels" in caplog.text
    assert "per example" in packing_layers(model).summary()
    examples = examples_for(model)
    with torch.no_grad():
        assert _relative(model(**_packed_inputs(examples)).logits[0], alone_logits(model, examples)) < 1e-5


INKLING2 = {t: c for t, c in (("inkling2_text", "Inkling2ForCausalLM"), ("inkling2_loop_text", "Inkling2LoopForCausalLM"))
            if importlib.util.find_spec(f"transformers.models.{t.removesuffix('_text')}") is not None}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(INKLING2))
def test_a_convolution_without_conv1d_is_found_by_its_taps(model_type):
    """Inkling2's keys and values pass a short causal convolution written with unfold (no Conv1d, no A_log):
    found by its conv_kernel_size and its taps parameter, run per example, exact."""
    from _hybrids import sweep

    model = sweep.build_tiny(model_type, INKLING2[model_type])
    model.set_attn_implementation("eager")  # the only attention Inkling2 has
    model.config.use_cache = False
    kinds = {type(m).__name__ for _, m in find_stateful_layers(model)}
    assert any("DynamicShortConvolution" in kind for kind in kinds), kinds
    examples = examples_for(model)
    with torch.no_grad():
        alone = alone_logits(model, examples)
        packed = enable_packing(model)(**_packed_inputs(examples)).logits[0]
    assert _relative(packed, alone) < 1e-5
