"""plan_epoch: every example once per epoch, no batch over budget, equal steps per rank, balance."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from packing_collators.sampler._epoch_plan import _ranges, plan_epoch


def all_batches(plan) -> list[list[int]]:
    return [plan.batch(step, rank) for step in range(plan.num_steps) for rank in range(plan.num_replicas)]


def check_plan(plan, lengths: np.ndarray, budget: int, *, drop_last: bool) -> None:
    batches = all_batches(plan)
    counts = Counter(i for batch in batches for i in batch)
    usable = set(np.flatnonzero((lengths > 0) & (lengths <= budget)).tolist())
    stats = plan.stats()
    assert plan.num_rows % plan.num_replicas == 0
    assert all(batches), "no empty batch"
    assert all(len(set(batch)) == len(batch) for batch in batches), "no example twice in one batch"
    tokens = [int(lengths[batch].sum()) for batch in batches]
    assert max(tokens, default=0) <= budget
    assert tokens == plan.row_tokens.tolist()
    assert [int((lengths[b] ** 2).sum()) for b in batches] == plan.batch_attention.tolist()
    assert set(counts) <= usable
    if drop_last:
        assert max(counts.values(), default=1) == 1
        assert len(usable) - len(counts) == stats["drop_last_examples"]
        assert stats["repeated_examples"] == 0
    else:
        assert set(counts) == usable, "every example at least once"
        assert sum(counts.values()) - len(usable) == stats["repeated_examples"]
        assert stats["drop_last_examples"] == 0
        assert stats["padded_batches"] < plan.num_replicas
    assert stats["tokens"] == sum(tokens)
    assert stats["batches_per_epoch"] * plan.num_replicas == len(batches)


@pytest.mark.parametrize("seed", range(12))
def test_random_plans_hold_the_invariants(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    budget = int(rng.integers(1, 600))
    lengths = rng.integers(0, budget + 50, n)
    options = dict(
        num_replicas=int(rng.integers(1, 6)),
        epoch=int(rng.integers(0, 5)),
        seed=seed,
        shuffle=bool(rng.integers(2)),
        strategy=["bfd", "ffd", "next_fit"][seed % 3],
        group_size=[None, 1, 37, 1000][seed % 4],
        balance=["cost", "tokens", "attention", "none"][seed % 4],
        drop_last=bool(seed % 2),
        overflow="drop",
    )
    plan = plan_epoch(lengths, budget, **options)
    check_plan(plan, lengths, budget, drop_last=options["drop_last"])
    again = plan_epoch(lengths, budget, **options)
    assert np.array_equal(plan.example, again.example) and np.array_equal(plan.row_offsets, again.row_offsets)


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sft_like_plans_hold_the_invariants(num_replicas, drop_last, standard_lengths):
    lengths = standard_lengths("sft", 3000, seed=num_replicas)
    plan = plan_epoch(lengths, 4096, num_replicas=num_replicas, drop_last=drop_last, epoch=1)
    check_plan(plan, lengths, 4096, drop_last=drop_last)


def test_the_epoch_and_seed_change_the_order_and_nothing_else(standard_lengths):
    lengths = standard_lengths("sft", 2000)
    plans = [plan_epoch(lengths, 4096, num_replicas=2, epoch=e, seed=s) for e, s in [(0, 0), (1, 0), (0, 1)]]
    orders = [all_batches(p) for p in plans]
    assert orders[0] != orders[1] and orders[0] != orders[2] and orders[1] != orders[2]
    for plan in plans:
        assert sorted(set(plan.example.tolist())) == list(range(2000))


def test_no_shuffle_is_the_dataset_order_for_next_fit():
    plan = plan_epoch([3, 3, 3, 4, 4, 1], 7, shuffle=False, strategy="next_fit", balance="none")
    assert plan.batches(rank=0) == [[0, 1], [2, 3], [4, 5]]


def test_padding_repeats_examples_from_the_start_of_the_epoch():
    # 3 bins of one example each, 2 ranks: one more bin, made of example 0 (first in dataset order)
    plan = plan_epoch([5, 6, 7], 8, num_replicas=2, shuffle=False)
    stats = plan.stats()
    assert (stats["padded_batches"], stats["repeated_examples"], stats["repeated_tokens"]) == (1, 1, 5)
    assert sorted(map(tuple, all_batches(plan))) == [(0,), (0,), (1,), (2,)]


def test_padding_a_tiny_epoch_cycles_over_its_bins():
    # one bin holds everything; 4 ranks need 3 more batches, never empty, never an example twice in one
    plan = plan_epoch([1, 2], 8, num_replicas=4)
    batches = all_batches(plan)
    assert len(batches) == 4 and all(sorted(b) == [0, 1] for b in batches)
    assert plan.stats()["repeated_examples"] == 6


def test_drop_last_drops_the_bins_with_fewest_tokens():
    plan = plan_epoch([8, 7, 2], 8, num_replicas=2, drop_last=True)
    stats = plan.stats()
    assert sorted(plan.example.tolist()) == [0, 1]
    assert (stats["drop_last_examples"], stats["drop_last_tokens"], stats["batches_per_epoch"]) == (1, 2, 1)


def test_drop_last_with_fewer_bins_than_ranks_drops_everything_and_says_so():
    plan = plan_epoch([4, 4], 4, num_replicas=3, drop_last=True)
    assert plan.num_rows == 0 and plan.stats()["drop_last_examples"] == 2
    assert plan.stats()["efficiency"] == 1.0


def test_empty_and_overflowing_examples_are_counted_not_batched():
    plan = plan_epoch([0, 5, 12, 3, 0, 20], 10, overflow="drop")
    stats = plan.stats()
    assert sorted(plan.example.tolist()) == [1, 3]
    assert stats["empty_examples"] == 2
    assert (stats["overflow_dropped_examples"], stats["overflow_dropped_tokens"]) == (2, 32)


def test_no_examples_gives_no_batches():
    plan = plan_epoch([], 10, num_replicas=3)
    assert plan.num_rows == 0 and plan.batches(rank=2) == []
    assert plan.stats()["imbalance"] == 0.0


def test_an_example_over_the_budget_is_an_error_naming_it():
    with pytest.raises(
        ValueError, match=r"Example 2 has 12 tokens, more than max_tokens_per_batch=10 .*overflow='drop'"
    ):
        plan_epoch([5, 3, 12, 30], 10)


@pytest.mark.parametrize(
    "option, message",
    [({"balance": "flops"}, "balance='flops' is not supported"), ({"overflow": "truncate"}, "overflow='truncate'")],
)
def test_bad_options_are_errors(option, message):
    with pytest.raises(ValueError, match=message):
        plan_epoch([1, 2], 10, **option)


def test_groups_pack_separately(standard_lengths):
    lengths = standard_lengths("sft", 1000)
    plan = plan_epoch(lengths, 4096, shuffle=False, group_size=250, num_replicas=1)
    group_of = np.repeat(np.arange(4), 250)
    assert all(len(set(group_of[batch])) == 1 for batch in plan.batches(rank=0))


def test_balancing_by_cost_evens_out_the_ranks(standard_lengths):
    lengths = standard_lengths("sft", 20000, high=4096)
    balanced = plan_epoch(lengths, 8192, num_replicas=8).stats()
    unbalanced = plan_epoch(lengths, 8192, num_replicas=8, balance="none").stats()
    assert balanced["imbalance"] < 0.01 < unbalanced["imbalance"]
    assert balanced["step_imbalance"] < unbalanced["step_imbalance"] / 5
    by_attention = plan_epoch(lengths, 8192, num_replicas=8, balance="attention").stats()
    assert by_attention["imbalance_attention"] < 0.01 < unbalanced["imbalance_attention"]
    by_tokens = plan_epoch(lengths, 8192, num_replicas=8, balance="tokens").stats()
    assert by_tokens["imbalance_tokens"] <= unbalanced["imbalance_tokens"]


def test_the_steps_of_a_balanced_plan_hold_bins_of_similar_cost(standard_lengths):
    lengths = standard_lengths("sft", 5000, high=4096)
    plan = plan_epoch(lengths, 8192, num_replicas=4, shuffle=False)
    cost = (plan.row_tokens + plan.batch_attention / 8192).reshape(-1, 4)
    assert np.all(np.diff(cost.max(1)) <= 1e-9), "unshuffled steps run from the costliest down"
    assert np.all(cost.min(1)[:-1] >= cost.max(1)[1:] - 1e-9), "each step's bins are next to each other by cost"


def test_efficiency_is_near_the_lower_bound(standard_lengths):
    lengths = standard_lengths("sft", 20000)
    stats = plan_epoch(lengths, 16384).stats()
    assert stats["efficiency"] > 0.99
    assert stats["total_batches"] - stats["lower_bound_batches"] <= 1


@pytest.mark.parametrize("seed", range(5))
def test_ranges_concatenates_aranges(seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 50, 20)
    ends = starts + rng.integers(0, 5, 20)
    expected = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
    assert np.array_equal(_ranges(starts, ends), expected)


def test_the_default_attention_weight_is_one_over_the_budget(standard_lengths):
    lengths = standard_lengths("reasoning", 3000)
    default = plan_epoch(lengths, 32768, num_replicas=4, seed=1)
    # a power-of-two budget: attention * (1 / 32768) is attention / 32768 bit for bit
    explicit = plan_epoch(lengths, 32768, num_replicas=4, seed=1, attention_weight=1 / 32768)
    assert all_batches(default) == all_batches(explicit)
    assert default.attention_weight is None and explicit.attention_weight == 1 / 32768
    assert default.stats() == {**explicit.stats(), "attention_weight": 1 / 32768}


def test_the_attention_weight_is_the_cost_model_of_the_plan_and_its_stats(standard_lengths):
    lengths = standard_lengths("long_tail", 3000)
    plan = plan_epoch(lengths, 16384, num_replicas=2, attention_weight=1e-3)
    cost = plan.row_tokens + 1e-3 * plan.batch_attention.astype(float)
    assert np.allclose(plan.rank_costs()["cost"], cost.reshape(-1, 2).sum(0))
    steps = cost.reshape(-1, 2)
    assert plan.stats()["step_imbalance"] == pytest.approx(steps.max(1).sum() / steps.mean(1).sum() - 1)
    assert plan.stats()["attention_weight"] == 1e-3


@pytest.mark.parametrize("distribution, high, budget", [("reasoning", None, 65536), ("long_tail", 8192, 32768)])
def test_a_heavy_attention_weight_balances_attention_on_long_context(distribution, high, budget, standard_lengths):
    lengths = standard_lengths(distribution, 10000, high=high)
    by_tokens = plan_epoch(lengths, budget, num_replicas=8, attention_weight=0).stats()
    by_attention = plan_epoch(lengths, budget, num_replicas=8, attention_weight=1.0).stats()
    assert by_tokens["imbalance_attention"] > 0.02  # the tokens even, the attention far apart
    assert by_attention["imbalance_attention"] < by_tokens["imbalance_attention"] / 10
    assert by_attention["imbalance_tokens"] < 0.01  # the tokens stay even (the bins are full)


@pytest.mark.parametrize(
    "weight, error, message",
    [
        (-1e-5, ValueError, r"attention_weight must be a finite number >= 0, got -1e-05\. Pass None for the default"),
        (float("nan"), ValueError, "attention_weight must be a finite number >= 0, got nan"),
        (float("inf"), ValueError, "got inf.*for attention alone use balance='attention'"),
        (10**400, ValueError, "attention_weight must be a finite number >= 0, got 1000"),  # not an OverflowError
        ("0.001", TypeError, "attention_weight must be a number or None, got str '0.001'"),
        (True, TypeError, "attention_weight must be a number or None, got bool True"),
    ],
)
def test_a_bad_attention_weight_is_an_error(weight, error, message):
    with pytest.raises(error, match=message):
        plan_epoch([1, 2], 10, attention_weight=weight)
