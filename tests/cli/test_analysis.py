"""_analysis: padding waste and every packing's numbers agree with the engine, the sampler and pack_dataset."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from packing_collators import MultipackBatchSampler, pack_dataset, pack_lengths
from packing_collators.cli._analysis import (
    analyze_lengths,
    check_max_length,
    length_grouped_order,
    padded_tokens,
)


def test_padded_tokens_literal():
    # batches [5, 1] -> 2 * 5, [2, 8] -> 2 * 8, [3] -> 1 * 3
    assert padded_tokens(np.array([5, 1, 2, 8, 3]), 2, order=np.arange(5)) == 10 + 16 + 3
    assert padded_tokens(np.array([5, 1, 2, 8, 3]), 2, order=np.array([3, 0, 2, 1, 4])) == 16 + 4 + 3
    assert padded_tokens(np.array([], dtype=np.int64), 4, order=np.array([], dtype=np.int64)) == 0


@pytest.mark.parametrize("n, batch_size", [(7, 2), (1000, 8), (20_001, 4)])
def test_length_grouped_order_is_sorted_megabatches(n, batch_size, standard_lengths):
    lengths = standard_lengths("sft", n, seed=n)
    order = length_grouped_order(lengths, batch_size, np.random.default_rng(0))
    assert sorted(order.tolist()) == list(range(n)), "a permutation"
    megabatch = max(1, min(n // (batch_size * 4), 50)) * batch_size
    for start in range(0, n, megabatch):
        chunk = lengths[order[start : start + megabatch]]
        assert np.all(chunk[:-1] >= chunk[1:]), "each megabatch sorted, longest first"


def test_length_grouped_padding_matches_transformers_group_by_length(standard_lengths):
    torch = pytest.importorskip("torch")
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths, batch_size = standard_lengths("sft", 20_000, seed=1), 8
    theirs = np.array(
        get_length_grouped_indices(lengths.tolist(), batch_size, generator=torch.Generator().manual_seed(0))
    )
    ours = length_grouped_order(lengths, batch_size, np.random.default_rng(0))
    theirs_padded = padded_tokens(lengths, batch_size, theirs)
    ours_padded = padded_tokens(lengths, batch_size, ours)
    random_padded = padded_tokens(lengths, batch_size, np.random.default_rng(0).permutation(len(lengths)))
    assert abs(ours_padded / theirs_padded - 1) < 0.01, "same grouping, other random megabatches"
    assert ours_padded < 0.5 * random_padded


@pytest.mark.parametrize("overflow", ["truncate", "drop"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_strategies_match_the_engine(overflow, seed, standard_lengths):
    rng = np.random.default_rng(seed)
    lengths = np.r_[standard_lengths("sft", 3000, seed=seed, high=4000), np.zeros(5, np.int64)]
    rng.shuffle(lengths)
    max_length, batch_size = 1024, 4
    analysis = analyze_lengths(lengths, max_length, batch_size=batch_size, overflow=overflow, seed=seed)
    padded = analysis.padding[0].padded_tokens
    for strategy in ("bfd", "ffd", "next_fit"):
        stats = pack_lengths(lengths, max_length, strategy=strategy, overflow=overflow).stats()
        packing = analysis.packing(strategy)
        assert packing.rows == stats["rows"]
        assert packing.lower_bound == stats["lower_bound_rows"]
        assert packing.tokens == stats["packed_tokens"]
        assert packing.efficiency == pytest.approx(stats["efficiency"])
        assert packing.truncated_examples == stats["truncated_examples"]
        assert packing.dropped_examples == stats["dropped_examples"]
        assert packing.steps == math.ceil(stats["rows"] / batch_size)
        assert packing.speedup == pytest.approx(padded / (stats["rows"] * max_length))
    longer = int((lengths > max_length).sum())
    assert analysis.longer_examples == longer > 0
    assert analysis.empty_examples == 5
    if overflow == "truncate":
        assert analysis.lost_tokens == int(np.maximum(lengths - max_length, 0).sum())
    else:
        assert analysis.lost_tokens == int(lengths[lengths > max_length].sum())


def test_padding_counts_the_tokens_a_training_run_sees():
    lengths = np.array([5, 0, 12, 3, 7, 1, 9])
    analysis = analyze_lengths(lengths, 8, batch_size=2)
    random, grouped = analysis.padding
    assert random.tokens == grouped.tokens == 5 + 8 + 3 + 7 + 1 + 8, "12 and 9 cut to 8, the empty one left out"
    assert random.steps == grouped.steps == 3
    assert grouped.padded_tokens <= random.padded_tokens
    dropped = analyze_lengths(lengths, 8, batch_size=2, overflow="drop").padding[0]
    assert dropped.tokens == 5 + 3 + 7 + 1 and dropped.steps == 2


def test_wrapped_matches_pack_dataset(standard_lengths):
    from datasets import Dataset

    lengths = np.r_[standard_lengths("sft", 500, seed=3, high=700), [0, 0]]
    data = Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
    _, stats = pack_dataset(data, 256, strategy="wrapped", return_stats=True, progress=False)
    packing = analyze_lengths(lengths, 256, overflow="truncate").packing("wrapped")
    assert packing.rows == stats.rows == math.ceil(lengths.sum() / 256)
    assert packing.split_examples == stats.split_examples > 0
    assert packing.tokens == stats.packed_tokens == int(lengths.sum())
    assert packing.efficiency == pytest.approx(stats.efficiency)
    assert not packing.keeps_boundaries


@pytest.mark.parametrize("overflow", ["truncate", "drop"])
def test_sampler_matches_multipack_batch_sampler(overflow, standard_lengths):
    lengths = standard_lengths("sft", 4000, seed=4, high=3000)
    analysis = analyze_lengths(lengths, 2048, batch_size=4, max_tokens_per_batch=6000, overflow=overflow, seed=7)
    seen = np.minimum(lengths, 2048) if overflow == "truncate" else lengths[lengths <= 2048]
    stats = MultipackBatchSampler(seen, 6000, seed=7, num_replicas=1, rank=0).stats()
    packing = analysis.packing("sampler")
    assert packing.capacity == analysis.max_tokens_per_batch == 6000
    assert packing.rows == packing.steps == stats["batches_per_epoch"]
    assert packing.lower_bound == stats["lower_bound_batches"]
    assert packing.efficiency == pytest.approx(stats["efficiency"])
    longer = int((lengths > 2048).sum())
    assert (packing.truncated_examples, packing.dropped_examples) == (
        (longer, 0) if overflow == "truncate" else (0, longer)
    )


def test_sampler_budget_defaults_to_a_padded_batch_and_drops_what_exceeds_it():
    assert analyze_lengths([5, 3, 8], 8, batch_size=3).max_tokens_per_batch == 24
    packing = analyze_lengths([5, 3, 8, 2], 8, max_tokens_per_batch=6).packing("sampler")
    assert packing.dropped_examples == 1, "the 8-token example does not fit a 6-token budget"


def test_percentiles_are_lengths_of_real_examples(standard_lengths):
    analysis = analyze_lengths(np.arange(1, 1001), 2000)
    assert analysis.percentiles["min"] == 1 and analysis.percentiles["max"] == 1000
    assert (analysis.percentiles["p50"], analysis.percentiles["p90"], analysis.percentiles["p99"]) == (500, 900, 990)
    assert analysis.mean_length == 500.5
    lengths = standard_lengths("sft", 777, seed=6)
    percentiles = analyze_lengths(lengths, 2048).percentiles
    for key, value in percentiles.items():
        assert value in lengths
        if key.startswith("p"):
            assert np.mean(lengths <= value) >= float(key[1:]) / 100 - 1e-9 > np.mean(lengths < value)


def test_recommendation_raises_a_max_length_that_truncates_too_much(standard_lengths):
    lengths = standard_lengths("sft", 5000, seed=5)
    recommendation = analyze_lengths(lengths, 512).recommendation
    assert recommendation.max_length > 512 and recommendation.max_length % 128 == 0
    assert (lengths > recommendation.max_length).mean() <= 0.001
    assert recommendation.max_tokens_per_batch == 8 * recommendation.max_length
    assert any("truncates" in reason for reason in recommendation.reasons)
    assert recommendation.pack and recommendation.strategy in ("bfd", "ffd", "sampler")


def test_recommendation_says_padding_is_fine_when_lengths_are_equal():
    analysis = analyze_lengths([64] * 100, 64)
    assert analysis.padding[0].waste == 0.0
    assert not analysis.recommendation.pack
    assert "padding wastes only" in analysis.recommendation.reasons[0]


def test_as_dict_is_json(standard_lengths):
    data = json.loads(json.dumps(analyze_lengths(standard_lengths("sft", 300), 1024).as_dict()))
    assert [p["strategy"] for p in data["packings"]] == ["bfd", "ffd", "next_fit", "wrapped", "sampler"]
    assert {"efficiency", "rows_over_lower_bound", "speedup", "rows", "steps"} <= set(data["packings"][0])
    assert data["padding"][0]["order"] == "random" and "waste" in data["padding"][0]


def test_errors():
    with pytest.raises(ValueError, match=r"Every example is longer than max length 4 \(the shortest has 5 tokens\)"):
        analyze_lengths([5, 9, 0], 4)
    check_max_length(np.array([0, 0]), 4)  # nothing to pack is not this error
    with pytest.raises(ValueError, match="overflow='error' is not supported; choose one of 'truncate', 'drop'"):
        analyze_lengths([5], 8, overflow="error")
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        analyze_lengths([5], 8, batch_size=0)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        analyze_lengths([5], 0)
    with pytest.raises(ValueError, match="max_tokens_per_batch must be a positive integer or None, got 0"):
        analyze_lengths([5], 8, max_tokens_per_batch=0)
    with pytest.raises(TypeError, match="must be integers"):
        analyze_lengths([1.5, 2.0], 8)
