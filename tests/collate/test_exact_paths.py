"""Own training loops with a default-config model (``use_cache=True``): every collator's batch is exact.

transformers' default ``use_cache=True`` builds a KV cache in every forward, training included,
and with a cache its packed-sequence masks (sdpa, eager) are off, so the examples of a flat row
attend to each other. The collators' batches say ``use_cache=False``, so ``model(**batch)`` gives
the padded loss whatever the config says (it differed by ~2% before).
"""

import numpy as np
import pytest
import torch
from _tiny_models import padded_batch, random_examples, tiny_model

from packing_collators import FlatteningCollator, MultipackBatchSampler, PrePackedCollator

LENGTHS = [9, 4, 12, 6, 3, 10, 7, 5]


def default_config_model(arch, attn):
    model = tiny_model(arch, attn=attn, use_cache=True)  # transformers' default, not the tests' usual False
    assert model.config.use_cache is True and model.training
    return model


def loss(model, batch):
    with torch.no_grad():
        return model(**batch).loss


def prepacked_rows(examples, per_row=3):
    rows = []
    for start in range(0, len(examples), per_row):
        group = examples[start : start + per_row]
        rows.append(
            {
                "input_ids": sum((e["input_ids"] for e in group), []),
                "labels": sum((e["labels"] for e in group), []),
                "seq_lengths": [len(e["input_ids"]) for e in group],
            }
        )
    return rows


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_each_collator_gives_the_padded_loss_with_a_default_config_model(arch, attn):
    model = default_config_model(arch, attn)
    examples = random_examples(LENGTHS, seed=3, completion_only=True)
    padded = loss(model, padded_batch(examples))
    rows = prepacked_rows(examples)
    batches = {
        "flattening": FlatteningCollator()(examples),
        "flattening, padded to 16": FlatteningCollator(pad_to_multiple_of=16)(examples),
        "prepacked flatten": PrePackedCollator()(rows),
        "prepacked pad": PrePackedCollator(mode="pad", max_length=32)(rows),
    }
    for name, batch in batches.items():
        assert batch["use_cache"] is False, name
        torch.testing.assert_close(loss(model, batch), padded, rtol=1e-6, atol=1e-6, msg=name)
    # the control: the same batch with a cache is not exact (what the own loop got before)
    leaky = loss(model, {**batches["flattening"], "use_cache": True})
    assert abs(leaky.item() - padded.item()) > 1e-3


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sampler_and_flattening_collator_own_loop_is_exact(attn):
    model = default_config_model("llama", attn)
    examples = random_examples(np.random.default_rng(0).integers(2, 20, 40).tolist(), seed=4, completion_only=True)
    sampler = MultipackBatchSampler([len(e["input_ids"]) for e in examples], 48, seed=1)
    loader = torch.utils.data.DataLoader(examples, batch_sampler=sampler, collate_fn=FlatteningCollator())
    seen = 0
    for indices, batch in zip(sampler, loader):
        padded = loss(model, padded_batch([examples[i] for i in indices]))
        torch.testing.assert_close(loss(model, batch), padded, rtol=1e-6, atol=1e-6)
        seen += len(indices)
    assert seen == len(examples)


def test_the_cache_switch_can_be_turned_off_and_is_validated():
    batch = FlatteningCollator(disable_cache=False, return_tensors="np")([{"input_ids": [1, 2]}])
    assert "use_cache" not in batch
    assert "use_cache" not in PrePackedCollator(disable_cache=False)([{"input_ids": [1, 2], "seq_lengths": [2]}])
    with pytest.raises(TypeError, match="disable_cache must be True or False, got 'yes'"):
        FlatteningCollator(disable_cache="yes")
