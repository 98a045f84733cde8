"""The packed batch's loss and gradients equal the padded batch's, and contamination shows up.

Padded reference: right padding, attention_mask, labels -100 on pads, sdpa. Packed:
FlatteningCollator on the same examples, through each attention path that runs on CPU
(sdpa and eager via transformers' packed-sequence masks; packing_varlen with a reference
kernel standing in for the CUDA one). flex_attention has no CPU backward, and its CPU
forward compiles for ~50 s, so it is checked on the GPU (benchmarks/gpu/exactness.py attention).
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import (
    ARCHITECTURES,
    assert_same_loss_and_grads,
    causal_over_whole_row,
    loss_and_grads,
    padded_batch,
    random_examples,
    reference_varlen_attn,
    tiny_model,
)

from packing_collators import FlatteningCollator, check_packing_support, register_varlen_attention
from packing_collators.attention import _varlen as _attention

LENGTHS = [7, 3, 12, 5, 9]


@pytest.fixture
def reference_kernel(monkeypatch):
    """packing_varlen runs on CPU with a per-segment sdpa kernel of varlen_attn's signature."""
    register_varlen_attention()
    monkeypatch.setattr(_attention, "_load_varlen_attn", lambda query: reference_varlen_attn)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("attn", ["sdpa", "eager", "packing_varlen"])
def test_packed_equals_padded(arch, attn, reference_kernel):
    _check_packed_equals_padded(arch, attn, completion_only=True)


def test_packed_equals_padded_with_labels_from_input_ids():
    _check_packed_equals_padded("llama", "sdpa", completion_only=False)


def _check_packed_equals_padded(arch, attn, completion_only):
    examples = random_examples(LENGTHS, seed=3, completion_only=completion_only)
    reference = loss_and_grads(tiny_model(arch, attn="sdpa"), padded_batch(examples))
    model = tiny_model(arch, attn=attn)
    batch = FlatteningCollator()(examples)
    assert check_packing_support(model, batch) == attn
    assert_same_loss_and_grads(loss_and_grads(model, batch), reference)


def test_flex_attention_forward_on_cpu_is_not_run_here():
    # Documented gap: flex_attention's CPU forward compiles for ~50 s and it has no CPU backward.
    assert "flex_attention" in _attention._BUILTIN_NAMES


def test_num_items_in_batch_normalisation_matches():
    # What the Trainer passes with gradient accumulation: the sum over micro-batches divided by
    # the label tokens of all of them (labels[..., 1:] != -100, counted the Trainer's way).
    examples = random_examples(LENGTHS + [4, 6], seed=5, completion_only=True)
    micro = [examples[:3], examples[3:]]
    model = tiny_model("llama")

    def accumulated(collate):
        batches = [collate(m) for m in micro]
        n_items = sum(b["labels"][..., 1:].ne(-100).sum() for b in batches)
        return sum(model(**b, num_items_in_batch=n_items).loss for b in batches), n_items

    loss_packed, n_packed = accumulated(FlatteningCollator())
    loss_padded, n_padded = accumulated(padded_batch)
    by_hand = sum(sum(label != -100 for label in e["labels"][1:]) for e in examples)
    assert int(n_packed) == int(n_padded) == by_hand
    torch.testing.assert_close(loss_packed, loss_padded, rtol=1e-5, atol=0)


# --- contamination: without boundaries the loss changes, and the checks refuse it -----------------


def _model_padded_loss_and_flat_batch():
    """A tiny Llama, its loss on LENGTHS padded, and the same examples flattened (to be spoiled)."""
    examples = random_examples(LENGTHS, seed=3)
    model = tiny_model("llama")
    return model, model(**padded_batch(examples)).loss, FlatteningCollator()(examples)


def _relative_gap(a, b):
    return abs(float(a.detach()) - float(b.detach())) / abs(float(b.detach()))


def test_position_ids_that_do_not_restart_change_the_loss():
    model, padded, batch = _model_padded_loss_and_flat_batch()
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1])[None]
    assert _relative_gap(model(**batch).loss, padded) > 1e-3
    with pytest.raises(ValueError, match="position_ids do not restart where cu_seq_lens_q says"):
        check_packing_support(model, batch)


def test_a_cache_switches_packing_off_and_use_cache_is_refused():
    model, padded, batch = _model_padded_loss_and_flat_batch()
    torch.testing.assert_close(model(**batch).loss, padded, rtol=1e-5, atol=0)
    assert _relative_gap(model(**{**batch, "use_cache": True}).loss, padded) > 1e-3  # the batch says False
    model.config.use_cache = True
    without = {k: v for k, v in batch.items() if k != "use_cache"}
    assert _relative_gap(model(**without).loss, padded) > 1e-3  # the config's cache, with nothing to turn it off
    with pytest.raises(ValueError, match="use_cache is True"):
        check_packing_support(model, without)
    # the batch's use_cache=False wins over the config: the loss is the padded loss, and the check accepts it
    torch.testing.assert_close(model(**batch).loss, padded, rtol=1e-5, atol=0)
    assert check_packing_support(model, batch) == "sdpa"


def test_attention_mask_beside_a_flat_batch_changes_the_loss_and_is_refused():
    model, padded, batch = _model_padded_loss_and_flat_batch()
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    assert _relative_gap(model(**batch).loss, padded) > 1e-3
    with pytest.raises(ValueError, match="also has an attention_mask"):
        check_packing_support(model, batch)


def test_an_attention_that_ignores_boundaries_changes_the_loss_and_is_refused():
    from transformers import AttentionInterface

    AttentionInterface.register("test_ignores_boundaries", causal_over_whole_row)
    examples = random_examples(LENGTHS, seed=3)
    padded = tiny_model("llama")(**padded_batch(examples)).loss
    model = tiny_model("llama", attn="test_ignores_boundaries")
    batch = FlatteningCollator()(examples)
    assert _relative_gap(model(**batch).loss, padded) > 1e-3
    with pytest.raises(ValueError, match="not known to honour packed boundaries"):
        check_packing_support(model, batch)


def test_varlen_kernel_without_boundaries_changes_the_loss(reference_kernel):
    examples = random_examples(LENGTHS, seed=3)
    padded = tiny_model("llama")(**padded_batch(examples)).loss
    model = tiny_model("llama", attn="packing_varlen")
    batch = FlatteningCollator()(examples)
    total = batch["input_ids"].shape[1]
    batch.update(cu_seq_lens_q=torch.tensor([0, total], dtype=torch.int32), max_length_q=total)
    batch.update(cu_seq_lens_k=batch["cu_seq_lens_q"], max_length_k=total)
    assert _relative_gap(model(**batch).loss, padded) > 1e-3


def test_reference_kernel_matches_sdpa_on_one_segment():
    # The stand-in kernel itself: one causal segment equals plain causal sdpa.
    q, k, v = (torch.randn(6, 4, 8) for _ in range(3))
    cu = torch.tensor([0, 6], dtype=torch.int32)
    got = reference_varlen_attn(q, k, v, cu, cu, 6, 6, window_size=(-1, 0))
    want = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(0, 1) for x in (q, k, v)), is_causal=True)
    torch.testing.assert_close(got, want.transpose(0, 1))
