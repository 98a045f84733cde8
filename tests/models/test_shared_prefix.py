"""A shared-prompt row through stateful layers that compute each prompt once: Gated DeltaNet and KDA on kernels
that take initial states (the completions from the prompt's final state), Mamba2 and lightning attention on SSD
scans that take none (the prompt's final state's term added to each completion), gated short convolutions (the
conv alone on the keys' layout).

Measured on every tiny type with such layers (their configs' defaults) with the torch reference kernels
on the CPU (fla's signatures, initial and final states included): the row's logits, read in each sequence's order, equal
each sequence run alone, and logits and gradients equal the keys' layout (each prompt once per completion),
float32; each stateful layer's projection reads the row's tokens (each prompt once), the keys' layout every copy.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _hybrids import HYBRIDS, alone_logits, tiny_hybrid
from _varlen_reference import PREFIX_REFERENCE as VARLEN_PREFIX_REFERENCE
from _varlen_reference import REFERENCE as VARLEN_REFERENCE

from packing_collators._compat import attn_implementation
from packing_collators._model_unwrap import text_config
from packing_collators.batch import SEQUENCE_KEYS
from packing_collators.collate import shared_prompt_batch
from packing_collators.models import enable_packing, find_stateful_layers, packing_layers
from packing_collators.models._enable import enable_packing_with
from packing_collators.models._shared_mask import with_shared_mask
from packing_collators.models._varlen import varlen_layer


def _sequence(prompt: list[int], completion: list[int]) -> dict:
    return {"input_ids": prompt + completion, "labels": [-100] * len(prompt) + completion}


def _groups(vocab: int) -> list[list[dict]]:
    g = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    first, second = ids(9), ids(6)
    return [
        [_sequence(first, ids(n)) for n in (4, 7, 2)],  # a prompt and three completions
        [_sequence(ids(5), ids(6))],  # a sequence alone: laid out unshared
        [_sequence(second, ids(n)) for n in (3, 5)],
    ]


# each stateful layer's first projection, by family and layout: what the layer reads the row through
PROJECTION = {("Gated DeltaNet", "split"): "in_proj_qkv", ("Gated DeltaNet", "fused"): "in_proj_qkvz",
              ("KDA", "g_ab"): "q_proj", ("KDA", "g"): "q_proj", ("short convolution", "bcx"): "in_proj",
              ("Mamba2", "mamba2"): "in_proj", ("Mamba2", "falcon_h1"): "in_proj",
              ("lightning attention", "minimax"): "qkv_proj"}  # fmt: skip


def _once_layers(model) -> list:
    """The stateful layers whose family runs a shared prompt once (the rest keep the keys' layout)."""
    found = [(layer, varlen_layer(layer)) for _, layer in find_stateful_layers(model)]
    return [(layer, v) for layer, v in found if v is not None and v.family.shared is not None]


def _convs(layer) -> list:
    return [m for m in layer.modules() if isinstance(m, torch.nn.Conv1d)]


def _families(model_type: str) -> set:
    return {v.family for _, v in _once_layers(tiny_hybrid(model_type))}


# every tiny type with such a layer: Qwen3.5 (and its MoE), Qwen3-Next, LaRA, Qwen4-exp, LFM2/LFM2-MoE/LFM3, Kimi-Linear,
# Bailing-hybrid
ONCE = [m for m in HYBRIDS if _families(m)]


def _run(model, groups):
    """(the row's logits, the gradients, the tokens each such stateful layer's projection read) for the groups laid
    out with their prompts shared, a weighted sum of the logits backward."""
    seen = []
    for layer, varlen in _once_layers(model):
        projection = getattr(layer, PROJECTION[varlen.family.name, varlen.layout])
        projection.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    config = text_config(model)
    batch = shared_prompt_batch(groups)
    inputs = {k: v for k, v in batch.items() if k not in (*SEQUENCE_KEYS, "labels")}
    inputs = with_shared_mask(inputs, attn_implementation(config), torch.float32, config)
    logits = model(**inputs).logits
    weights = torch.linspace(-1, 1, logits.numel()).reshape(logits.shape)
    (logits * weights).sum().backward()
    return logits, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}, seen


def _keys_model(model_type: str):
    """The model on the keys' layout (each prompt once per completion): fla-signature kernels without states where
    its layers start completions from states, else the per-example path."""
    if any(f.shared_needs_states for f in _families(model_type)):
        return enable_packing_with(_tiny(model_type), lambda: (VARLEN_REFERENCE, ""))
    return enable_packing(_tiny(model_type))


def _tiny(model_type: str):
    return tiny_hybrid(model_type, defaults=("use_cache",)).train()


@pytest.mark.parametrize("model_type", ONCE)
def test_each_prompt_runs_once_and_every_sequence_gets_what_it_gets_alone(model_type):
    groups = _groups(_tiny(model_type).config.vocab_size)
    batch = shared_prompt_batch(groups)
    model = enable_packing_with(_tiny(model_type), lambda: (VARLEN_PREFIX_REFERENCE, ""))  # states, as fla's
    assert "a shared prompt once" in packing_layers(model).summary()
    logits, grads, seen = _run(model, groups)
    row, copies = batch["input_ids"].shape[1], batch["kv_index"].numel()
    assert copies > row and seen and set(seen) == {row}  # each stateful layer projected the row: each prompt once
    keys_logits, keys_grads, _ = _run(_keys_model(model_type), groups)

    sequences = [s for group in groups for s in group]
    alone = alone_logits(tiny_hybrid(model_type).train(), [{"input_ids": s["input_ids"]} for s in sequences])
    as_sequences = logits[0].index_select(0, batch["kv_index"])  # the row read in each sequence's order
    # float32 against the layers' own code alone: within 1e-5 of the logits' scale (other kernels, other rounding)
    assert float((as_sequences - alone).abs().max() / alone.abs().max()) < 1e-5
    torch.testing.assert_close(logits, keys_logits, rtol=1e-5, atol=1e-5)  # float32 rounding of other matmul shapes
    assert grads.keys() == keys_grads.keys()
    for name, grad in keys_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()) + 1e-7, msg=name)


@pytest.mark.parametrize("model_type", ONCE)
def test_one_group_runs_its_passes_as_the_rows_two_slices(model_type):
    # a micro-batch of one prompt's completions (TRL's G = batch size): [prompt | completions], no gathers
    from packing_collators.models._shared_prefix import shared_prefix

    groups = _groups(_tiny(model_type).config.vocab_size)[:1]
    batch = shared_prompt_batch(groups)
    assert shared_prefix(batch["kv_index"], batch["q_index"], batch["cu_seq_lens_k"]).split == 9
    logits, grads, _ = _run(enable_packing_with(_tiny(model_type), lambda: (VARLEN_PREFIX_REFERENCE, "")), groups)
    keys_logits, keys_grads, _ = _run(_keys_model(model_type), groups)
    torch.testing.assert_close(logits, keys_logits, rtol=1e-5, atol=1e-5)
    for name, grad in keys_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()) + 1e-7, msg=name)


WITH_CONVS = [m for m in ONCE if any(_convs(layer) for layer, _ in _once_layers(tiny_hybrid(m)))]


@pytest.mark.parametrize("model_type", WITH_CONVS)
def test_a_layers_conv_reads_only_the_window_of_each_copied_prompt(model_type):
    # the conv of a completion after its group's first needs its prompt's last width - 1 tokens, not all of it
    groups = _groups(_tiny(model_type).config.vocab_size)
    lengths = []

    def conv(x, *args, **kwargs):
        lengths.append(x.shape[1])
        return VARLEN_PREFIX_REFERENCE.conv(x, *args, **kwargs)

    kernels = dataclasses.replace(VARLEN_PREFIX_REFERENCE, conv=conv)
    model = enable_packing_with(_tiny(model_type), lambda: (kernels, ""))
    logits, grads, _ = _run(model, groups)
    keys_logits, keys_grads, _ = _run(_keys_model(model_type), groups)
    torch.testing.assert_close(logits, keys_logits, rtol=1e-5, atol=1e-5)
    for name, grad in keys_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()) + 1e-7, msg=name)
    batch = shared_prompt_batch(groups)
    row, copies = batch["input_ids"].shape[1], [9, 9, 6]  # the prompts of the sequences after each group's first
    widths = {conv.weight.shape[-1] for layer, _ in _once_layers(model) for conv in _convs(layer)}
    expected = {row + sum(min(p, w - 1) for p in copies) for w in widths}
    assert lengths and set(lengths) <= expected and max(lengths) < batch["kv_index"].numel()


@pytest.mark.parametrize("model_type", [m for m in ONCE if any(f.shared_needs_states for f in _families(m))])
def test_on_kernels_without_states_a_recurrence_keeps_the_keys_layout(model_type):
    groups = _groups(_tiny(model_type).config.vocab_size)
    model = enable_packing_with(_tiny(model_type), lambda: (VARLEN_REFERENCE, ""))  # no initial states
    assert "a shared prompt once" not in packing_layers(model).summary()
    _, _, seen = _run(model, groups)
    assert seen and set(seen) == {shared_prompt_batch(groups)["kv_index"].numel()}


@pytest.mark.parametrize("model_type", ONCE)
def test_a_row_with_no_shared_prompt_takes_one_pass(model_type):
    groups = [[_sequence([5, 6, 7], [8, 9])], [_sequence([4, 4], [6, 7, 8])]]
    logits, _, seen = _run(enable_packing_with(_tiny(model_type), lambda: (VARLEN_PREFIX_REFERENCE, "")), groups)
    keys_logits, _, _ = _run(_keys_model(model_type), groups)
    assert set(seen) == {shared_prompt_batch(groups)["input_ids"].shape[1]}  # nothing copied: the row
    torch.testing.assert_close(logits, keys_logits, rtol=1e-5, atol=1e-5)
