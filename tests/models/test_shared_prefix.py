"""A shared-prompt row through Gated DeltaNet on kernels that take initial states: each prompt computed once.

Measured on a tiny Qwen3.5-like hybrid (its config's defaults) with the torch reference kernels on the CPU
(fla's signatures, initial and final states included): the row's logits, read in each sequence's order, equal
each sequence run alone, and logits and gradients equal the keys' layout (each prompt once per completion),
float32; the delta rule reads the row's tokens only (the prompt once), where the keys' layout reads every copy.
"""

from __future__ import annotations

import pytest
import torch
from _gdn_reference import PREFIX_REFERENCE, REFERENCE
from _hybrids import HYBRIDS, alone_logits, tiny_hybrid

from packing_collators._compat import attn_implementation
from packing_collators._model_unwrap import text_config
from packing_collators.batch import SEQUENCE_KEYS
from packing_collators.collate import shared_prompt_batch
from packing_collators.models import packing_layers
from packing_collators.models._enable import enable_packing_with
from packing_collators.models._shared_mask import with_shared_mask

pytestmark = pytest.mark.skipif("qwen3_5_text" not in HYBRIDS, reason="this transformers has no Qwen3.5")


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


def _counting(kernels, seen: list[int]):
    def delta_rule(q, *rest, **options):
        seen.append(q.shape[1])
        return kernels.delta_rule(q, *rest, **options)

    import dataclasses

    return dataclasses.replace(kernels, delta_rule=delta_rule)


def _run(kernels, groups):
    model = enable_packing_with(tiny_hybrid("qwen3_5_text", defaults=("use_cache",)).train(), lambda: (kernels, ""))
    config = text_config(model)
    batch = shared_prompt_batch(groups)
    inputs = {k: v for k, v in batch.items() if k not in (*SEQUENCE_KEYS, "labels")}
    inputs = with_shared_mask(inputs, attn_implementation(config), torch.float32, config)
    logits = model(**inputs).logits
    weights = torch.linspace(-1, 1, logits.numel()).reshape(logits.shape)
    (logits * weights).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return model, batch, logits, grads


def test_each_prompt_runs_once_and_every_sequence_gets_what_it_gets_alone():
    groups = _groups(tiny_hybrid("qwen3_5_text").config.vocab_size)
    once, keys = [], []
    model, batch, logits, grads = _run(_counting(PREFIX_REFERENCE, once), groups)
    _, _, keys_logits, keys_grads = _run(_counting(REFERENCE, keys), groups)
    assert "a shared prompt once" in packing_layers(model).summary()

    row, copies = batch["input_ids"].shape[1], batch["kv_index"].numel()
    layers = len(once) // 2  # each layer: the prompts, then the rest
    assert sum(once) == layers * row and sum(keys) == layers * copies and copies > row

    sequences = [s for group in groups for s in group]
    reference = tiny_hybrid("qwen3_5_text", defaults=("use_cache",)).train()
    alone = alone_logits(reference, [{"input_ids": s["input_ids"]} for s in sequences])
    as_sequences = logits[0].index_select(0, batch["kv_index"])  # the row read in each sequence's order
    torch.testing.assert_close(as_sequences, alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, keys_logits, rtol=1e-5, atol=1e-6)
    assert grads.keys() == keys_grads.keys()
    for name, grad in keys_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()) + 1e-7, msg=name)


def test_a_row_with_no_shared_prompt_takes_one_pass():
    groups = [[_sequence([5, 6, 7], [8, 9])], [_sequence([4, 4], [6, 7, 8])]]
    seen = []
    _, batch, logits, _ = _run(_counting(PREFIX_REFERENCE, seen), groups)
    _, _, keys_logits, _ = _run(REFERENCE, groups)
    assert all(n == batch["input_ids"].shape[1] for n in seen)  # one call a layer, over the row
    torch.testing.assert_close(logits, keys_logits, rtol=1e-5, atol=1e-6)
