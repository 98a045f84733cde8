"""enable_packing across calls: what a model prepared for packed training meets besides one batch at a time.

Two packed forwards before one backward under gradient checkpointing (each layer's recompute keeps its own
forward's boundaries), batched ``generate`` with left padding (a cache is passed: nothing is packed), and a
``position_ids`` buffer refilled in place between batches. Tiny float32 hybrids on the CPU.
"""

from __future__ import annotations

import pytest
import torch
from _hybrids import HYBRIDS, alone_logits, examples_for, tiny_hybrid

from packing_collators import FlatteningCollator, enable_packing

TYPES = [t for t in ("qwen3_5_text", "nemotron_h", "lfm2") if t in HYBRIDS]


def _row(model, lengths, seed):
    return FlatteningCollator()(examples_for(model, lengths, seed=seed))


def _two_forwards_then_backward(model_type: str, checkpointing: dict | None, varlen: bool = False):
    if varlen:  # the Gated DeltaNet varlen path, on reference kernels (the GPU's path, on the CPU)
        from _gdn_reference import REFERENCE

        from packing_collators.models._enable import enable_packing_with

        model = enable_packing_with(tiny_hybrid(model_type).train(), lambda: (REFERENCE, ""))
    else:
        model = enable_packing(tiny_hybrid(model_type).train())
    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
    # the same shape and the same padded groups, other boundaries: only the boundaries tell them apart
    first, second = _row(model, (7, 12, 5), seed=0), _row(model, (5, 12, 7), seed=1)
    (model(**first).loss + model(**second).loss).backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("model_type", [*TYPES[:2], "qwen3_5_text varlen"])
def test_two_packed_forwards_before_one_backward_under_checkpointing(model_type, reentrant):
    model_type, _, path = model_type.partition(" ")
    if model_type not in HYBRIDS:
        pytest.skip(f"this transformers has no {model_type}")
    plain = _two_forwards_then_backward(model_type, None, varlen=bool(path))
    checkpointed = _two_forwards_then_backward(model_type, {"use_reentrant": reentrant}, varlen=bool(path))
    assert plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-4, atol=1e-6 * float(grad.abs().max()) + 1e-8)


def _generate(model, ids, mask):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False, use_cache=True,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    return out.sequences, torch.stack(out.scores, 1)


@pytest.mark.parametrize("model_type", TYPES)
def test_batched_generate_with_left_padding_is_unchanged_by_enable_packing(model_type):
    """Left padding restarts generate's positions; with the cache passed in, the call is not a packed row."""
    model = tiny_hybrid(model_type)
    model.config.use_cache = True
    examples = examples_for(model, (8, 5))
    ids, mask = torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, 8 - n :], mask[row, 8 - n :] = torch.tensor(example["input_ids"]), 1
    tokens, scores = _generate(model, ids, mask)
    enable_packing(model)
    tokens_after, scores_after = _generate(model, ids, mask)
    assert torch.equal(tokens_after, tokens)
    torch.testing.assert_close(scores_after, scores, rtol=1e-5, atol=1e-5)


def test_a_position_ids_buffer_refilled_in_place_is_read_again():
    """A static input buffer (refilled with copy_, as CUDA-graph loops do) holds a new batch: new boundaries."""
    model = enable_packing(tiny_hybrid(TYPES[0]))
    first, second = _row(model, (7, 12, 5), seed=0), _row(model, (5, 12, 7), seed=1)
    buffers = {"input_ids": first["input_ids"].clone(), "position_ids": first["position_ids"].clone()}
    with torch.no_grad():
        model(**buffers)
        for key, buffer in buffers.items():
            buffer.copy_(second[key])
        refilled = model(**buffers).logits[0]
        alone = alone_logits(model, examples_for(model, (5, 12, 7), seed=1))
    assert float((refilled - alone).abs().max()) < 1e-4


def test_the_base_model_called_without_the_boundaries_keeps_the_calls():
    """MambaForCausalLM hands its backbone no position_ids or cu_seq_lens: the backbone's own hook must not
    reset the boundaries its model's call opened (before, it did: the packed loss was 0.0063 off padding)."""
    from _hybrids import sweep

    model = sweep.build_tiny("mamba", "MambaForCausalLM")
    examples = examples_for(model)
    with torch.no_grad():
        alone = alone_logits(model, examples)
        packed = enable_packing(model)(**FlatteningCollator()(examples)).logits[0]
    assert float((packed - alone).abs().max()) < 1e-5
