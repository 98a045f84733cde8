"""Benchmark the packing engine against the packing inside TRL's pack_dataset.

What each contender includes:
- ours `pack_lengths(lengths, 2048, strategy="bfd")`: lengths (numpy) in, rows of indices out,
  packed globally over all examples.
- TRL `_pack_bfd` per 1,000 examples: what `trl.pack_dataset(strategy="bfd")` runs inside each
  batched `map` call (its default batch of 1,000), on an Arrow table holding an `input_ids`
  column of the same lengths; it includes TRL's Arrow gather of the packed rows.
- TRL `pack_dataset(Dataset)` whole call: the same, plus `datasets.map` overhead (reported once).

Usage: python benchmarks/cpu/bench_engine.py [--examples 200000] [--large 10000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from packing_collators import pack_lengths

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import alternate, command, lengths_of, machine, median, write_results  # noqa: E402


def arrow_table(lengths: np.ndarray) -> pa.Table:
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    values = pa.array(np.zeros(int(offsets[-1]), np.int32))
    return pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), values)})


def trl_chunked(table: pa.Table, capacity: int, chunk: int = 1000) -> int:
    """Rows TRL's BFD makes when packing 1,000 examples at a time, as pack_dataset does."""
    from trl.data_utils import _pack_bfd

    return sum(len(_pack_bfd(table.slice(i, chunk), capacity)) for i in range(0, len(table), chunk))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=200_000)
    parser.add_argument("--large", type=int, default=10_000_000, help="lengths for the scale run (0 to skip)")
    parser.add_argument("--capacity", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    lengths = lengths_of("sft", args.examples)
    capacity = args.capacity
    table = arrow_table(lengths)
    lower = math.ceil(lengths.sum() / capacity)
    rows = {}
    times = alternate(
        {
            "ours": lambda: rows.__setitem__("ours", pack_lengths(lengths, capacity).num_rows),
            "trl": lambda: rows.__setitem__("trl", trl_chunked(table, capacity)),
        },
        args.repeats,
    )
    ours_s, trl_s = median(times["ours"]), median(times["trl"])

    from datasets import Dataset
    from trl import pack_dataset as trl_pack_dataset

    dataset = Dataset.from_dict({"input_ids": table.column("input_ids").to_pylist()})
    start = time.perf_counter()
    trl_whole = len(trl_pack_dataset(dataset, capacity, strategy="bfd"))
    trl_whole_s = time.perf_counter() - start

    eff = {k: lengths.sum() / (v * capacity) for k, v in rows.items()}
    lines = [
        f"## Packing engine: {args.examples:,} `sft` lengths, capacity {capacity}",
        "",
        f"Machine: {machine()}. Median of {args.repeats} alternating runs. Command: `{command()}`",
        "",
        "| contender | what it includes | time (s) | rows | gap to lower bound | efficiency |",
        "|---|---|---|---|---|---|",
        f'| ours `pack_lengths(strategy="bfd")` | lengths in, rows of indices out (global) | {ours_s:.3f} | {rows["ours"]:,} | {rows["ours"] - lower} | {eff["ours"]:.4%} |',
        f"| TRL `_pack_bfd` per 1,000 examples | the packing inside `trl.pack_dataset` (incl. its Arrow gather) | {trl_s:.3f} | {rows['trl']:,} | {rows['trl'] - lower} | {eff['trl']:.4%} |",
        f"| TRL `pack_dataset` whole call (1 run) | the above plus `datasets.map` | {trl_whole_s:.3f} | {trl_whole:,} | {trl_whole - lower} | {lengths.sum() / (trl_whole * capacity):.4%} |",
        "",
        f"Speed-up of ours over TRL's packing: **{trl_s / ours_s:.1f}x** (over its whole call: {trl_whole_s / ours_s:.1f}x). Lower bound: {lower:,} rows.",
    ]
    data = {
        "examples": args.examples,
        "capacity": capacity,
        "lower_bound_rows": lower,
        "machine": machine(),
        "ours_s": ours_s,
        "trl_chunked_s": trl_s,
        "trl_whole_call_s": trl_whole_s,
        "rows": rows,
        "trl_whole_rows": trl_whole,
        "efficiency": eff,
        "speedup": trl_s / ours_s,
        "command": command(),
    }
    if args.large:
        big = lengths_of("sft", args.large, seed=1)
        lines += [
            "",
            f"### Scale: {args.large:,} `sft` lengths, capacity {capacity} (1 run each)",
            "",
            "| strategy | time (s) | rows | gap to lower bound | efficiency |",
            "|---|---|---|---|---|",
        ]
        data["large"] = {}
        for strategy in ("bfd", "ffd", "next_fit"):
            start = time.perf_counter()
            result = pack_lengths(big, capacity, strategy=strategy)
            seconds = time.perf_counter() - start
            gap = result.num_rows - result.lower_bound_rows
            lines.append(f"| {strategy} | {seconds:.2f} | {result.num_rows:,} | {gap} | {result.efficiency:.4%} |")
            data["large"][strategy] = {
                "seconds": seconds,
                "rows": result.num_rows,
                "efficiency": result.efficiency,
                "gap": gap,
            }
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    write_results("engine", markdown, data)


if __name__ == "__main__":
    main()
