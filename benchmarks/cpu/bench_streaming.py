"""Streaming pack_dataset: peak memory and throughput of "wrapped" and "bfd" as the stream grows.

A generator of `sft` examples (``input_ids`` int32, drawn in blocks of 10,000) is packed by
``pack_dataset(generator, max_length, strategy=..., buffer_size=...)`` and every row is read. Each
(strategy, size) runs in a fresh subprocess, so its peak RSS (VmHWM) is its own; "source only"
reads the generator without packing: the floor (Python, numpy, pyarrow, the generator). Flat RSS
from the smallest to the largest size is the claim (bounded memory); rows/s and tokens/s come from
the same runs. Strategies alternate within each repeat (order reversed every other repeat) and the
table quotes medians: the machine is shared, so compare wrapped with bfd by their ratio.

    python benchmarks/cpu/bench_streaming.py                       # 100k, 300k, 1M examples, 3 repeats
    python benchmarks/cpu/bench_streaming.py --sizes 20000,50000 --repeats 1 --no-write
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import DISTRIBUTIONS, command, lengths_of, machine, peak_rss_mib, write_results  # noqa: E402

BLOCK = 10_000


def examples(n: int, args):
    """``n`` examples ``{"input_ids": int32 array}``, lengths from ``args.dist`` clipped to max_length."""
    rng = np.random.default_rng(args.seed)
    for start in range(0, n, BLOCK):
        lengths = lengths_of(args.dist, min(BLOCK, n - start), args.seed + start, high=args.max_length)
        tokens = rng.integers(0, 32000, int(lengths.sum()), dtype=np.int32)
        for ids in np.split(tokens, np.cumsum(lengths)[:-1]):
            yield {"input_ids": ids}


def child(strategy: str, n: int, args) -> dict:
    """Pack (or, for "source", only read) an n-example generator; runs in a fresh process."""
    start = time.perf_counter()
    if strategy == "source":
        rows, tokens = 0, sum(len(example["input_ids"]) for example in examples(n, args))
        stats = None
    else:
        from packing_collators import pack_dataset

        packed, stats = pack_dataset(
            examples(n, args), args.max_length, strategy=strategy, buffer_size=args.buffer_size, return_stats=True
        )
        rows = tokens = 0
        for row in packed:
            rows += 1
            tokens += len(row["input_ids"])
        assert rows == stats.rows and tokens == stats.packed_tokens == stats.input_tokens, (rows, tokens, stats)
    seconds = time.perf_counter() - start
    return {
        "strategy": strategy,
        "examples": n,
        "rows": rows,
        "tokens": tokens,
        "seconds": seconds,
        "peak_rss_mib": peak_rss_mib(),
        "efficiency": stats.efficiency if stats else None,
        "rows_over_lower_bound": stats.rows_over_lower_bound if stats else None,
        "split_examples": stats.split_examples if stats else None,
    }


def run_child(strategy: str, n: int, args) -> dict:
    argv = [sys.executable, __file__, "--child", strategy, str(n), "--buffer-size", str(args.buffer_size)]
    argv += ["--dist", args.dist, "--seed", str(args.seed), "--max-length", str(args.max_length)]
    output = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def measure(args) -> list[dict]:
    """Every (strategy, size), alternating strategies within each repeat; medians of time, max of RSS."""
    strategies = args.strategies.split(",")
    runs: dict[tuple[str, int], list[dict]] = {}
    for repeat in range(args.repeats):
        for n in (int(s) for s in args.sizes.split(",")):
            for strategy in strategies if repeat % 2 == 0 else reversed(strategies):
                result = run_child(strategy, n, args)
                runs.setdefault((strategy, n), []).append(result)
                print(f"repeat {repeat}: {strategy} {n:,}: {result['seconds']:.1f} s, {result['peak_rss_mib']:.0f} MiB")
    summary = []
    for (strategy, n), results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        first = results[0]
        summary.append(
            {
                **first,
                "seconds": seconds,
                "times_s": [r["seconds"] for r in results],
                "peak_rss_mib": max(r["peak_rss_mib"] for r in results),
                "peak_rss_runs_mib": [r["peak_rss_mib"] for r in results],
                "rows_per_s": first["rows"] / seconds,
                "tokens_per_s": first["tokens"] / seconds,
                "examples_per_s": n / seconds,
            }
        )
    order = {s: i for i, s in enumerate(strategies)}
    return sorted(summary, key=lambda r: (order[r["strategy"]], r["examples"]))


def markdown(results: list[dict], args, cmd: str) -> str:
    sizes = sorted({r["examples"] for r in results})
    lines = [
        "# Streaming pack_dataset: memory and throughput (wrapped and bfd)",
        "",
        f"Command: `{cmd}`",
        "",
        f"A generator of `{args.dist}` examples (`input_ids` int32, clipped to {args.max_length}), packed with "
        f"`pack_dataset(generator, {args.max_length}, strategy=..., buffer_size={args.buffer_size:,})`, every row "
        "read as a dict of lists. Each run in a fresh process; peak RSS is that whole process (VmHWM: Python, "
        "numpy, pyarrow, datasets). `source` reads the generator only. "
        f"{args.repeats} repeat(s), strategies alternating; time is the median, RSS the largest. "
        f"CPU ({machine()}), 2 shared cores: compare wrapped with bfd by ratio.",
        "",
        "| strategy | examples | tokens | rows | efficiency | split examples | time (s) | rows/s | tokens/s (M) | peak RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        efficiency = "" if r["efficiency"] is None else f"{r['efficiency']:.4%}"
        split = "" if r["split_examples"] is None else f"{r['split_examples']:,}"
        lines.append(
            f"| {r['strategy']} | {r['examples']:,} | {r['tokens']:,} | {r['rows']:,} | {efficiency} | {split} | "
            f"{r['seconds']:.1f} | {r['rows_per_s']:,.0f} | {r['tokens_per_s'] / 1e6:.2f} | {r['peak_rss_mib']:.0f} |"
        )
    by = {(r["strategy"], r["examples"]): r for r in results}
    lines += ["", "| strategy | peak RSS growth " + f"{sizes[0]:,} -> {sizes[-1]:,} | wrapped time / bfd time |"]
    lines += ["|---|---:|---:|"]
    for strategy in dict.fromkeys(r["strategy"] for r in results):
        growth = by[(strategy, sizes[-1])]["peak_rss_mib"] - by[(strategy, sizes[0])]["peak_rss_mib"]
        ratios = [
            by[("wrapped", n)]["seconds"] / by[("bfd", n)]["seconds"]
            for n in sizes
            if strategy == "wrapped" and ("bfd", n) in by
        ]
        ratio = ", ".join(f"{x:.2f}x" for x in ratios)
        lines.append(f"| {strategy} | {growth:+.0f} MiB | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000,1000000", help="comma-separated example counts")
    parser.add_argument("--strategies", default="wrapped,bfd,source", help="'source' reads the generator only")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--buffer-size", type=int, default=10_000)
    parser.add_argument("--dist", choices=sorted(DISTRIBUTIONS), default="sft")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results/")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child[0], int(args.child[1]), args)))
        return
    cmd = command()
    results = measure(args)
    text = markdown(results, args, cmd)
    print(text)
    print(f"Command: {cmd}")
    if not args.no_write:
        write_results("streaming", text, {"command": cmd, "machine": machine(), "results": results})


if __name__ == "__main__":
    main()
