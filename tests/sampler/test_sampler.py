"""MultipackBatchSampler: exact len, set_epoch, resume mid-epoch, errors, DataLoader use."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packing_collators import FlatteningCollator, MultipackBatchSampler


def random_lengths(seed: int, n: int = 500, high: int = 300) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, high, n)


def every_rank(lengths, budget, num_replicas, **options) -> list[list[list[int]]]:
    return [
        list(MultipackBatchSampler(lengths, budget, num_replicas=num_replicas, rank=rank, **options))
        for rank in range(num_replicas)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_len_is_what_iteration_yields_on_every_rank_and_epoch(seed):
    rng = np.random.default_rng(seed)
    lengths = random_lengths(seed, n=int(rng.integers(1, 600)))
    num_replicas = int(rng.integers(1, 5))
    options = dict(
        drop_last=bool(seed % 2), group_size=[None, 50][seed % 2], balance=["cost", "none", "tokens"][seed % 3]
    )
    for rank in range(num_replicas):
        sampler = MultipackBatchSampler(lengths, 700, num_replicas=num_replicas, rank=rank, seed=seed, **options)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            batches = list(sampler)
            assert len(sampler) == len(batches) == sampler.stats()["batches_per_epoch"]
            assert all(0 < lengths[b].sum() <= 700 for b in batches)
            assert all(isinstance(i, int) for b in batches for i in b)


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 5])
def test_ranks_together_cover_the_epoch_exactly_once_plus_the_counted_repeats(num_replicas):
    lengths = random_lengths(num_replicas, n=777)
    ranks = every_rank(lengths, 1000, num_replicas, seed=3)
    assert len({len(batches) for batches in ranks}) == 1
    counts = Counter(i for batches in ranks for batch in batches for i in batch)
    assert set(counts) == set(range(777))
    repeated = MultipackBatchSampler(lengths, 1000, num_replicas=num_replicas, seed=3).stats()["repeated_examples"]
    assert sum(counts.values()) - 777 == repeated


def test_drop_last_leaves_out_only_what_it_reports():
    lengths = random_lengths(0, n=301)
    ranks = every_rank(lengths, 900, 4, drop_last=True)
    counts = Counter(i for batches in ranks for batch in batches for i in batch)
    dropped = MultipackBatchSampler(lengths, 900, num_replicas=4, drop_last=True).stats()["drop_last_examples"]
    assert max(counts.values()) == 1 and len(counts) + dropped == 301
    assert len({len(batches) for batches in ranks}) == 1


def test_set_epoch_changes_the_order_deterministically():
    lengths = random_lengths(1)
    sampler = MultipackBatchSampler(lengths, 1000, num_replicas=2, rank=1)
    first = list(sampler)
    assert list(sampler) == first, "the same epoch again is the same order"
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first
    other = MultipackBatchSampler(lengths.tolist(), 1000, num_replicas=2, rank=1)
    other.set_epoch(1)
    assert list(other) == second
    assert list(MultipackBatchSampler(lengths, 1000, num_replicas=2, rank=1, seed=1)) != first


def test_shuffle_false_is_the_same_every_epoch():
    lengths = random_lengths(2)
    sampler = MultipackBatchSampler(lengths, 1000, shuffle=False)
    first = list(sampler)
    sampler.set_epoch(5)
    assert list(sampler) == first


@pytest.mark.parametrize("num_replicas, rank", [(1, 0), (3, 2)])
def test_resume_from_any_point_yields_exactly_the_remaining_batches(num_replicas, rank):
    lengths = random_lengths(4, n=400)
    options = dict(num_replicas=num_replicas, rank=rank, seed=7)
    reference = MultipackBatchSampler(lengths, 600, **options)
    reference.set_epoch(2)
    full = list(reference)
    for stop in range(len(full) + 1):
        sampler = MultipackBatchSampler(lengths, 600, **options)
        sampler.set_epoch(2)
        batches = iter(sampler)
        head = [next(batches) for _ in range(stop)]
        state = sampler.state_dict()
        assert (state["epoch"], state["batches_yielded"]) == (2, stop)
        resumed = MultipackBatchSampler(lengths, 600, **options)
        resumed.load_state_dict(state)
        resumed.set_epoch(2)  # what a training loop does at the start of every epoch: keeps the resume point
        assert len(resumed) == len(full) - stop
        assert head + list(resumed) == full
        assert list(resumed) == full, "after the resumed epoch, iterating again starts from its beginning"


def test_resume_then_the_next_epoch_starts_from_its_first_batch():
    lengths = random_lengths(5)
    sampler = MultipackBatchSampler(lengths, 800)
    sampler.load_state_dict({"epoch": 1, "batches_yielded": 3})
    assert len(sampler) == sampler.stats()["batches_per_epoch"] - 3
    sampler.set_epoch(2)
    assert len(sampler) == sampler.stats()["batches_per_epoch"]
    assert sampler.state_dict()["batches_yielded"] == 0


def test_rank_0_state_resumes_every_rank():
    lengths = random_lengths(6)
    state = MultipackBatchSampler(lengths, 800, num_replicas=2, rank=0).state_dict()
    state["batches_yielded"] = 2
    other = MultipackBatchSampler(lengths, 800, num_replicas=2, rank=1)
    full = list(other)
    other.load_state_dict(state)
    assert list(other) == full[2:]


@pytest.mark.parametrize(
    "state, message",
    [
        ({"epoch": 0, "batches_yielded": 0, "seed": 1}, "saved with seed=1 but this sampler has seed=0"),
        ({"epoch": 0, "batches_yielded": 0, "num_replicas": 4}, "saved with num_replicas=4"),
        ({"epoch": 0, "batches_yielded": 10_000}, "10000 batches were yielded in epoch 0, but it has only"),
        ({"epoch": 0, "batches_yielded": -1}, "batches_yielded must be an integer >= 0"),
    ],
)
def test_a_state_that_does_not_fit_is_an_error(state, message):
    sampler = MultipackBatchSampler(random_lengths(0), 800)
    with pytest.raises(ValueError, match=message):
        sampler.load_state_dict(state)


def test_an_example_over_the_budget_is_an_error_at_construction():
    lengths = [10, 20, 3000, 40]
    with pytest.raises(
        ValueError, match=r"Example 2 has 3000 tokens, more than max_tokens_per_batch=2048.*overflow='drop'"
    ):
        MultipackBatchSampler(lengths, 2048)


def test_overflow_drop_and_empty_examples_are_left_out_and_counted():
    sampler = MultipackBatchSampler([10, 0, 3000, 40, 2049], 2048, overflow="drop")
    assert sorted(i for batch in sampler for i in batch) == [0, 3]
    stats = sampler.stats()
    assert (stats["overflow_dropped_examples"], stats["overflow_dropped_tokens"], stats["empty_examples"]) == (
        2,
        5049,
        1,
    )


@pytest.mark.parametrize(
    "options, error, message",
    [
        (
            {"strategy": "worst_fit"},
            ValueError,
            "strategy='worst_fit' is not supported; choose one of 'bfd', 'ffd', 'next_fit'",
        ),
        ({"balance": "flops"}, ValueError, "balance='flops' is not supported"),
        ({"overflow": "truncate"}, ValueError, "overflow='truncate' is not supported; choose one of 'error', 'drop'"),
        ({"max_tokens_per_batch": 0}, ValueError, "max_tokens_per_batch must be a positive integer, got 0"),
        ({"max_tokens_per_batch": 8.5}, ValueError, "max_tokens_per_batch must be a positive integer, got 8.5"),
        ({"num_replicas": 2, "rank": 2}, ValueError, "rank=2 is out of range for num_replicas=2"),
        ({"num_replicas": 0}, ValueError, "num_replicas must be a positive integer"),
        ({"seed": -1}, ValueError, "seed must be an integer >= 0"),
        ({"group_size": 0}, ValueError, "group_size must be a positive integer"),
        ({"lengths": [3, -1]}, ValueError, r"Example 1 has a negative length \(-1\)"),
        ({"lengths": [[1, 2]]}, ValueError, "must be one-dimensional"),
        ({"lengths": [1.5, 2]}, TypeError, "must be integers"),
    ],
)
def test_bad_arguments_are_errors(options, error, message):
    arguments = {"lengths": [3, 4], "max_tokens_per_batch": 8, **options}
    with pytest.raises(error, match=message):
        MultipackBatchSampler(arguments.pop("lengths"), arguments.pop("max_tokens_per_batch"), **arguments)


def test_set_epoch_needs_a_non_negative_integer():
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        MultipackBatchSampler([3], 8).set_epoch(-1)


def test_without_torch_distributed_it_is_one_rank():
    sampler = MultipackBatchSampler([3, 4], 8)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)


def test_lengths_may_be_a_tensor():
    lengths = torch.tensor([5, 2, 4, 1, 3, 6, 7, 2])
    assert list(MultipackBatchSampler(lengths, 8)) == list(MultipackBatchSampler(lengths.tolist(), 8))


def test_stats_report_what_was_planned():
    lengths = random_lengths(8, n=1000)
    sampler = MultipackBatchSampler(lengths, 2000, num_replicas=3)
    stats = sampler.stats()
    batches = every_rank(lengths, 2000, 3)
    tokens = sum(int(lengths[b].sum()) for rank in batches for b in rank)
    assert stats["epoch"] == 0 and stats["examples"] == 1000
    assert stats["tokens"] == tokens
    assert stats["efficiency"] == pytest.approx(tokens / (stats["total_batches"] * 2000))
    assert stats["efficiency"] > 0.95
    assert 0 <= stats["imbalance"] < 0.05 and 0 <= stats["step_imbalance"]
    assert set(stats) >= {"imbalance_tokens", "imbalance_attention", "padded_batches", "drop_last_examples"}


def test_a_dataloader_with_the_flattening_collator_gets_budget_sized_rows():
    rng = np.random.default_rng(9)
    examples = [{"input_ids": list(range(1, int(n) + 1))} for n in rng.integers(1, 100, 300)]
    lengths = [len(e["input_ids"]) for e in examples]
    sampler = MultipackBatchSampler(lengths, 256, num_replicas=2, rank=1)
    loader = DataLoader(examples, batch_sampler=sampler, collate_fn=FlatteningCollator())
    batches = list(loader)
    assert len(loader) == len(batches) == len(sampler)
    assert all(batch["input_ids"].shape[1] <= 256 for batch in batches)
    expected = [sum(lengths[i] for i in b) for b in sampler]
    assert [batch["input_ids"].shape[1] for batch in batches] == expected


def test_repr_names_the_settings():
    assert repr(MultipackBatchSampler([3], 8)).startswith("MultipackBatchSampler(1 examples, max_tokens_per_batch=8,")


def test_accelerate_sharding_a_one_rank_sampler_covers_the_epoch_with_equal_counts():
    # what accelerator.prepare(dataloader) does on 3 processes: deal the sampler's batches round-robin
    from accelerate.data_loader import BatchSamplerShard

    lengths = random_lengths(10, n=400)
    sampler = MultipackBatchSampler(lengths, 900, num_replicas=1, rank=0)
    shards = [list(BatchSamplerShard(sampler, num_processes=3, process_index=r)) for r in range(3)]
    assert len({len(shard) for shard in shards}) == 1
    assert {i for shard in shards for batch in shard for i in batch} == set(range(400))
    assert all(lengths[batch].sum() <= 900 for shard in shards for batch in shard)


def test_check_ranks_false_builds_without_a_collective(monkeypatch):
    # A sampler built on one rank only (to read a plan) must not wait for the others.
    import packing_collators.sampler._batch_sampler as module

    called = []
    monkeypatch.setattr(module, "check_ranks_agree", lambda *a, **k: called.append(1))
    MultipackBatchSampler([3, 4, 5], 8, num_replicas=2, rank=0, check_ranks=False)
    assert called == []
    MultipackBatchSampler([3, 4, 5], 8, num_replicas=2, rank=0)
    assert called == [1]


def test_the_attention_weight_reaches_the_plan_fingerprint_repr_and_state():
    lengths = random_lengths(4, n=300)
    default = MultipackBatchSampler(lengths, 800, num_replicas=2, rank=0)
    weighted = MultipackBatchSampler(lengths, 800, num_replicas=2, rank=0, attention_weight=1e-3)
    assert default.plan().attention_weight is None and weighted.plan().attention_weight == 1e-3
    assert default._fingerprint()["attention_weight"] is None
    assert weighted._fingerprint() == {**default._fingerprint(), "attention_weight": 1e-3}
    assert "attention_weight=0.001, " in repr(weighted) and "attention_weight=None, " in repr(default)
    assert weighted.stats()["attention_weight"] == 1e-3
    with pytest.raises(
        ValueError, match="saved with attention_weight=None but this sampler has attention_weight=0.001"
    ):
        weighted.load_state_dict(default.state_dict())


@pytest.mark.parametrize(
    "weight, error, message",
    [
        (-1, ValueError, "attention_weight must be a finite number >= 0, got -1"),
        (float("inf"), ValueError, "attention_weight must be a finite number >= 0, got inf"),
        ([1e-3], TypeError, "attention_weight must be a number or None, got list"),
    ],
)
def test_a_bad_attention_weight_is_an_error_at_construction(weight, error, message):
    with pytest.raises(error, match=message):
        MultipackBatchSampler([3, 4], 8, attention_weight=weight)


@pytest.mark.parametrize("lengths", [[], [0, 0, 0]])
def test_nothing_to_batch_yields_nothing_with_a_warning(lengths):
    with pytest.warns(UserWarning, match=f"got {len(lengths)} examples with tokens in none of them, so it yields no batch"):
        sampler = MultipackBatchSampler(lengths, 8)
    assert list(sampler) == [] and len(sampler) == 0
