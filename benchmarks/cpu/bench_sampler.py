"""Benchmark MultipackBatchSampler against padded batching: planning time, efficiency, rank balance.

Usage: python benchmarks/cpu/bench_sampler.py [--examples 1000000] [--budget 16384] [--repeats 5]
       [--ranks 8] [--lengths-rows 100000]
CPU check: python benchmarks/cpu/bench_sampler.py --examples 20000 --repeats 1

The contenders and what else is measured: see docs/benchmarks.md#how-bench_samplerpy-measures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import BatchSampler, RandomSampler

from packing_collators import MultipackBatchSampler, lengths_from_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import LONG_CONTEXT, alternate, command, lengths_of, machine, median, write_results  # noqa: E402

BALANCES = ("cost", "tokens", "attention", "none")
IMBALANCES = ("step_imbalance", "imbalance", "imbalance_tokens", "imbalance_attention")
# distribution: (lengths_of keywords, budget); long_tail's tail clipped at 8k, reasoning's at its 32k
LONG_CONTEXT_SETUP = {"long_tail": ({"high": 8192}, 32768), "reasoning": ({}, 65536)}


def versions() -> str:
    import transformers

    return f"numpy {np.__version__}, torch {torch.__version__}, transformers {transformers.__version__}"


def padded_stats(batches: list[list[int]], lengths: np.ndarray, budget: int) -> dict:
    """Efficiency of padded batches (each padded to its longest example)."""
    sizes = np.fromiter(map(len, batches), np.int64, len(batches))
    flat = np.fromiter((i for b in batches for i in b), np.int64, int(sizes.sum()))
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    longest = np.maximum.reduceat(lengths[flat], starts)
    real, computed = int(lengths[flat].sum()), int((sizes * longest).sum())
    return {
        "batches": len(batches),
        "efficiency": real / (len(batches) * budget),
        "padding": 1 - real / computed,
        "over_budget": int((sizes * longest > budget).sum()),
    }


def length_grouped_token_budget(lengths: np.ndarray, budget: int, batch_size: int, seed: int) -> list[list[int]]:
    """transformers' length-grouped order, cut into batches that fit the budget when padded."""
    from transformers.trainer_pt_utils import get_length_grouped_indices

    generator = torch.Generator().manual_seed(seed)
    order = get_length_grouped_indices(lengths.tolist(), batch_size, generator=generator)
    order_lengths = lengths[order].tolist()
    batches, start, n = [], 0, len(order)
    while start < n:
        longest, end = order_lengths[start], start + 1
        while end < n and (end - start + 1) * max(longest, order_lengths[end]) <= budget:
            longest = max(longest, order_lengths[end])
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def planning(lengths: np.ndarray, budget: int, ranks: int, repeats: int):
    """Each contender plans an epoch and lists its batches, alternating: its times, its batches, the padded size."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    padded_batch = budget // int(lengths.max())
    out: dict[str, list] = {}

    def seeded():
        return torch.Generator().manual_seed(0)

    plans = {
        "ours_1": lambda: MultipackBatchSampler(lengths, budget, num_replicas=1, rank=0),
        f"ours_{ranks}": lambda: MultipackBatchSampler(lengths, budget, num_replicas=ranks, rank=0),
        "batch_sampler": lambda: BatchSampler(
            RandomSampler(range(len(lengths)), generator=seeded()), padded_batch, False
        ),
        "length_grouped": lambda: BatchSampler(
            LengthGroupedSampler(padded_batch, lengths=lengths.tolist(), generator=seeded()), padded_batch, False
        ),
        "length_grouped_budget": lambda: length_grouped_token_budget(lengths, budget, padded_batch, 0),
    }
    contenders = {name: lambda n=name, plan=plan: out.__setitem__(n, list(plan())) for name, plan in plans.items()}
    return alternate(contenders, repeats), out, padded_batch


def imbalances(lengths: np.ndarray, budget: int, num_replicas: int, balance: str) -> dict:
    stats = MultipackBatchSampler(lengths, budget, num_replicas=num_replicas, rank=0, balance=balance).stats()
    return {key: stats[key] for key in IMBALANCES}


def long_context_balance(examples: int, ranks: tuple[int, ...] = (2, 8)) -> dict:
    """The planned imbalances of each balancing mode on the long-context distributions."""
    table = {}
    for distribution in LONG_CONTEXT:
        options, budget = LONG_CONTEXT_SETUP[distribution]
        lengths = lengths_of(distribution, examples, **options)
        table[distribution] = {
            "budget": budget,
            "max_length": int(lengths.max()),
            "mean_length": float(lengths.mean()),
            "ranks": {r: {balance: imbalances(lengths, budget, r, balance) for balance in BALANCES} for r in ranks},
        }
    return table


def long_context_lines(table: dict, examples: int) -> list[str]:
    lines = [
        "",
        f"### Balance on long-context lengths, {examples:,} examples (planned; max over ranks of total / mean - 1)",
        "",
        "Step and cost imbalance are by the default cost model (`tokens + sum(len²) / budget`) in every row; "
        "the attention column shows what a mode that ignores attention leaves uneven.",
        "",
        "| distribution | budget | ranks | balance | step imbalance | cost imbalance | token imbalance | attention imbalance |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for distribution, entry in table.items():
        label = f"`{distribution}` (max {entry['max_length']:,}, mean {entry['mean_length']:,.0f})"
        for num_replicas, modes in entry["ranks"].items():
            for balance, row in modes.items():
                lines.append(
                    f"| {label} | {entry['budget']:,} | {num_replicas} | `{balance}`{' (default)' if balance == 'cost' else ''} | "
                    f"{row['step_imbalance']:.4%} | {row['imbalance']:.4%} | {row['imbalance_tokens']:.4%} | "
                    f"{row['imbalance_attention']:.4%} |"
                )
    return lines


def lengths_timing(rows: int, repeats: int) -> dict:
    """``lengths_from_dataset`` against a Python loop over the rows (datasets' own, when installed)."""
    sizes = lengths_of("flan_like", rows, seed=2)
    offsets = np.r_[0, np.cumsum(sizes)].astype(np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(int(offsets[-1]), np.int32)))
    table = pa.table({"input_ids": column})
    try:
        from datasets import Dataset
    except ImportError:  # e.g. a machine without datasets: the Arrow table itself
        dataset, loop_label = table, '[len(ids) for ids in table.column("input_ids").to_pylist()]'
        rows_of = lambda: table.column("input_ids").to_pylist()  # noqa: E731
    else:
        dataset, loop_label = Dataset(table).shuffle(seed=0), '[len(ids) for ids in ds["input_ids"]]'
        rows_of = lambda: dataset["input_ids"]  # noqa: E731
    result = {}

    def arrow():
        result["arrow"] = lengths_from_dataset(dataset)

    def loop():
        result["loop"] = np.array([len(ids) for ids in rows_of()])

    times = alternate({"arrow": arrow, "loop": loop}, repeats)
    assert np.array_equal(result["arrow"], result["loop"])
    return {
        "rows": rows,
        "arrow_s": median(times["arrow"]),
        "loop_s": median(times["loop"]),
        "loop": loop_label,
        "shuffled": not isinstance(dataset, pa.Table),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--budget", type=int, default=16384, help="max_tokens_per_batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=8, help="simulated ranks for the balance numbers")
    parser.add_argument("--lengths-rows", type=int, default=100_000, help="rows for lengths_from_dataset (0 skips)")
    args = parser.parse_args()
    budget, ranks = args.budget, args.ranks
    lengths = lengths_of("sft", args.examples)
    lower = int(np.ceil(lengths.sum() / budget))

    times, out, padded_batch = planning(lengths, budget, ranks, args.repeats)
    plan_s = {name: median(values) for name, values in times.items()}
    ours = MultipackBatchSampler(lengths, budget).stats()
    ours_ranks = MultipackBatchSampler(lengths, budget, num_replicas=ranks, rank=0).stats()
    quality = {
        name: {"batches": stats["total_batches"], "efficiency": stats["efficiency"], "padding": 0.0, "over_budget": 0}
        for name, stats in (("ours_1", ours), (f"ours_{ranks}", ours_ranks))
    }
    for name in ("batch_sampler", "length_grouped", "length_grouped_budget"):
        quality[name] = padded_stats(out[name], lengths, budget)
    labels = {
        "ours_1": "ours `MultipackBatchSampler`, 1 rank",
        f"ours_{ranks}": f"ours `MultipackBatchSampler`, {ranks} ranks (plan all, list rank 0)",
        "batch_sampler": f"torch `BatchSampler(RandomSampler)`, {padded_batch} per batch, padded",
        "length_grouped": f"transformers `LengthGroupedSampler` (group_by_length), {padded_batch} per batch, padded",
        "length_grouped_budget": "group_by_length mega-batches cut to the token budget, padded",
    }
    base = plan_s["ours_1"]
    lines = [
        f"## Multipack sampler: {args.examples:,} `sft` examples, {budget:,}-token micro-batches",
        "",
        f"Machine: {machine()}, {os.cpu_count()} cores; {versions()}. Median of {args.repeats} alternating runs. Command: `{command()}`",
        "",
        "Each contender plans one epoch and lists its batches of indices. Efficiency = real tokens / "
        "(batches x budget); padding = pad tokens / tokens computed. "
        f"Lower bound: {lower:,} batches.",
        "",
        "| contender | plan an epoch (s) | vs ours | batches (all ranks) | efficiency | padding | batches over budget |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in labels.items():
        q = quality[name]
        lines.append(
            f"| {label} | {plan_s[name]:.3f} | {plan_s[name] / base:.2f}x | {q['batches']:,} | {q['efficiency']:.4%} | "
            f"{q['padding']:.1%} | {q['over_budget']} |"
        )
    balance = {mode: imbalances(lengths, budget, ranks, mode) for mode in ("cost", "attention", "tokens", "none")}
    lines += [
        "",
        f"### Balance over {ranks} simulated ranks (max over ranks of epoch total / mean - 1)",
        "",
        f"{ours_ranks['padded_batches']} batches of repeated examples pad the last round ({ours_ranks['repeated_examples']} examples, "
        f"{ours_ranks['repeated_tokens']:,} tokens).",
        "",
        "| balance | cost imbalance | token imbalance | attention imbalance | step imbalance (time lost waiting) |",
        "|---|---|---|---|---|",
    ]
    for mode, row in balance.items():
        lines.append(
            f"| `{mode}`{' (default)' if mode == 'cost' else ''} | {row['imbalance']:.4%} | {row['imbalance_tokens']:.4%} | "
            f"{row['imbalance_attention']:.4%} | {row['step_imbalance']:.4%} |"
        )
    long_context = long_context_balance(args.examples)
    lines += long_context_lines(long_context, args.examples)
    groups = {}
    lines += [
        "",
        "### `group_size`: packing the shuffled epoch in groups (1 rank, median of 3)",
        "",
        "| group_size | plan an epoch (s) | batches | efficiency |",
        "|---|---|---|---|",
    ]
    for group_size in (None, 100_000, 10_000):
        seconds = []
        for _ in range(3):
            start = time.perf_counter()
            stats = MultipackBatchSampler(lengths, budget, group_size=group_size).stats()
            seconds.append(time.perf_counter() - start)
        groups[str(group_size)] = {
            "seconds": median(seconds),
            "batches": stats["total_batches"],
            "efficiency": stats["efficiency"],
        }
        lines.append(
            f"| {group_size if group_size else 'None (default: one group)'} | {median(seconds):.3f} | "
            f"{stats['total_batches']:,} | {stats['efficiency']:.4%} |"
        )
    others = {}
    lines += [
        "",
        f"### Other distributions, {args.examples:,} examples, 1 rank",
        "",
        "| distribution | batches | lower bound | efficiency |",
        "|---|---|---|---|",
    ]
    for distribution in ("flan_like", "orcamath_like", "long_tail"):
        stats = MultipackBatchSampler(lengths_of(distribution, args.examples), budget).stats()
        others[distribution] = stats
        lines.append(
            f"| `{distribution}` | {stats['total_batches']:,} | {stats['lower_bound_batches']:,} | {stats['efficiency']:.4%} |"
        )
    data = {
        "examples": args.examples,
        "budget": budget,
        "ranks": ranks,
        "repeats": args.repeats,
        "machine": f"{machine()}, {os.cpu_count()} cores; {versions()}",
        "command": command(),
        "lower_bound_batches": lower,
        "plan_seconds": plan_s,
        "plan_seconds_all": times,
        "quality": quality,
        "balance": balance,
        "long_context_balance": long_context,
        "padded_batch_size": padded_batch,
        "ours_stats": ours,
        f"ours_{ranks}_stats": ours_ranks,
        "group_size": groups,
        "other_distributions": {
            k: {"efficiency": v["efficiency"], "batches": v["total_batches"]} for k, v in others.items()
        },
    }
    if args.lengths_rows:
        timing = lengths_timing(args.lengths_rows, max(3, args.repeats // 2))
        data["lengths_from_dataset"] = timing
        lines += [
            "",
            f"### `lengths_from_dataset`: {timing['rows']:,} `flan_like` rows"
            + (" of a shuffled `Dataset` (indices mapping)" if timing["shuffled"] else " of an Arrow table"),
            "",
            "| how | time (s) |",
            "|---|---|",
            f"| `lengths_from_dataset(ds)` (Arrow `list_value_length`) | {timing['arrow_s']:.4f} |",
            f"| `{timing['loop']}` | {timing['loop_s']:.3f} |",
            "",
            f"Speed-up: **{timing['loop_s'] / timing['arrow_s']:.0f}x**.",
        ]
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    write_results("sampler", markdown, data)


if __name__ == "__main__":
    main()
