"""Offline dataset packing: packing_collators.pack_dataset vs TRL's pack_dataset, side by side.

Both run in this process on the same in-memory ``datasets.Dataset`` (``input_ids`` int32 and
``attention_mask`` int8, as a tokenizer writes them), alternating, several repeats; the table
quotes medians and the ratio. Efficiency = real tokens / (rows * capacity); the lower bound is
ceil(tokens / capacity) rows. Then streaming: a generator of examples of growing length is packed
in a fresh subprocess per size, reporting peak RSS (flat = bounded memory), and the efficiency
cost of the buffer size.

    python benchmarks/cpu/bench_pack_dataset.py                    # the full run (a few minutes on 2 cores)
    python benchmarks/cpu/bench_pack_dataset.py --examples 20000 --repeats 2 --stream-sizes 10000,50000
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import DISTRIBUTIONS, lengths_of, peak_rss_mib  # noqa: E402


def make_dataset(dist: str, n: int, seed: int):
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    lengths = lengths_of(dist, n, seed)
    total = int(lengths.sum())
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    tokens = np.random.default_rng(seed + 1).integers(0, 32000, total, dtype=np.int32)
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(tokens)),
            "attention_mask": pa.ListArray.from_arrays(offsets, pa.array(np.ones(total, np.int8))),
        }
    )
    return datasets.Dataset(InMemoryTable(table)), total


def efficiency_of(packed, capacity: int) -> tuple[float, int]:
    import pyarrow.compute as pc

    column = packed.data.table.column("input_ids")
    tokens = int(pc.sum(pc.list_value_length(column)).as_py())
    return tokens / (len(packed) * capacity), tokens


def side_by_side(args) -> list[dict]:
    import datasets
    import trl
    from trl import pack_dataset as trl_pack

    from packing_collators import pack_dataset

    datasets.disable_progress_bars()
    dataset, total = make_dataset(args.dist, args.examples, args.seed)
    lower_bound = math.ceil(total / args.max_length)
    results = []
    for strategy in args.strategies.split(","):
        runners = {
            "packing_collators": lambda s=strategy: pack_dataset(dataset, args.max_length, strategy=s),
            f"trl {trl.__version__}": lambda s=strategy: trl_pack(dataset, args.max_length, strategy=s),
        }
        times = {name: [] for name in runners}
        outputs = {}
        for repeat in range(args.repeats):
            for name, run in runners.items() if repeat % 2 == 0 else reversed(runners.items()):
                start = time.perf_counter()
                outputs[name] = run()
                times[name].append(time.perf_counter() - start)
        for name, packed in outputs.items():
            efficiency, tokens = efficiency_of(packed, args.max_length)
            assert tokens == total, (name, tokens, total)
            results.append(
                {
                    "strategy": strategy,
                    "implementation": name,
                    "median_s": statistics.median(times[name]),
                    "times_s": times[name],
                    "rows": len(packed),
                    "lower_bound_rows": lower_bound,
                    "efficiency": efficiency,
                }
            )
    return results


def stream_child(n: int, args) -> dict:
    """Pack an n-example generator; report peak RSS, rows and efficiency (runs in a fresh process)."""
    from packing_collators import pack_dataset

    def examples():
        rng = np.random.default_rng(args.seed)
        for start in range(0, n, 10_000):
            lengths = lengths_of(
                args.dist, min(10_000, n - start), args.seed + start, high=args.max_length
            )  # = stream_lengths
            tokens = rng.integers(0, 32000, int(lengths.sum()), dtype=np.int32)
            for ids in np.split(tokens, np.cumsum(lengths)[:-1]):
                yield {"input_ids": ids}

    rows, stats = pack_dataset(examples(), args.max_length, buffer_size=args.buffer_size, return_stats=True)
    start = time.perf_counter()
    count = sum(1 for _ in rows)
    seconds = time.perf_counter() - start
    assert count == stats.rows
    return {
        "examples": n,
        "buffer_size": args.buffer_size,
        "rows": stats.rows,
        "lower_bound_rows": stats.lower_bound_rows,
        "efficiency": stats.efficiency,
        "seconds": seconds,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_child(n: int, buffer_size: int, args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--stream-child",
        str(n),
        "--buffer-size",
        str(buffer_size),
        "--dist",
        args.dist,
        "--seed",
        str(args.seed),
        "--max-length",
        str(args.max_length),
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def stream_lengths(n: int, args) -> np.ndarray:
    """The lengths the streaming generator yields (drawn in blocks of 10,000)."""
    blocks = [
        lengths_of(args.dist, min(10_000, n - s), args.seed + s, high=args.max_length) for s in range(0, n, 10_000)
    ]
    return np.concatenate(blocks)


def global_efficiency(n: int, args) -> float:
    """Global (in-memory) bfd on the same lengths as the stream, for the buffer table's reference row."""
    from packing_collators import pack_lengths

    return pack_lengths(stream_lengths(n, args), args.max_length).efficiency


def markdown(side, stream, buffers, command, args) -> str:
    ours = {r["strategy"]: r for r in side if r["implementation"] == "packing_collators"}
    lines = [
        "# pack_dataset: packing_collators vs TRL",
        "",
        f"Command: `{command}`",
        "",
        f"{args.examples:,} `{args.dist}` examples (input_ids int32 + attention_mask int8, in memory), capacity "
        f"{args.max_length}; {args.repeats} repeats alternating, median. CPU, 2 shared cores: compare the ratio.",
        "",
        "| strategy | implementation | median time (s) | speed-up | rows | lower bound | efficiency |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in side:
        speedup = r["median_s"] / ours[r["strategy"]]["median_s"]
        lines.append(
            f"| {r['strategy']} | {r['implementation']} | {r['median_s']:.3f} | "
            f"{'1.00x (ours)' if r['implementation'] == 'packing_collators' else f'ours {speedup:.1f}x faster'} | "
            f"{r['rows']:,} | {r['lower_bound_rows']:,} | {r['efficiency']:.4%} |"
        )
    if stream:
        lines += [
            "",
            f"## Streaming (generator of `{args.dist}` examples, buffer_size={args.buffer_size:,})",
            "",
            "Each size in a fresh process; peak RSS is the whole process (Python, torch import included).",
            "",
            "| examples | rows | efficiency | time (s) | peak RSS (MiB) |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in stream:
            lines.append(
                f"| {r['examples']:,} | {r['rows']:,} | {r['efficiency']:.4%} | {r['seconds']:.1f} | {r['peak_rss_mib']:.0f} |"
            )
    if buffers:
        lines += [
            "",
            f"## Efficiency cost of the buffer ({buffers[0]['examples']:,} `{args.dist}` examples)",
            "",
            "| buffer_size | rows | lower bound | efficiency | peak RSS (MiB) |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in buffers:
            lines.append(
                f"| {r['buffer_size']:,} | {r['rows']:,} | {r['lower_bound_rows']:,} | {r['efficiency']:.4%} | {r['peak_rss_mib']:.0f} |"
            )
        lines.append(f"| global (in memory) | | | {buffers[0]['global_efficiency']:.4%} | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=200_000)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--dist", choices=sorted(DISTRIBUTIONS), default="sft")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategies", default="bfd,wrapped", help="comma-separated, each run by both libraries")
    parser.add_argument("--stream-sizes", default="100000,1000000", help="comma-separated; empty to skip")
    parser.add_argument("--buffer-size", type=int, default=10_000)
    parser.add_argument("--buffer-sizes", default="1000,10000,100000", help="efficiency per buffer size; empty to skip")
    parser.add_argument("--buffer-examples", type=int, default=200_000)
    parser.add_argument(
        "--out", default=None, help="write <out>.md and <out>.json (e.g. benchmarks/results/pack_dataset)"
    )
    parser.add_argument("--stream-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stream_child is not None:
        print(json.dumps(stream_child(args.stream_child, args)))
        return
    command = "python benchmarks/cpu/bench_pack_dataset.py " + " ".join(sys.argv[1:])
    side = side_by_side(args)
    stream = [run_child(int(n), args.buffer_size, args) for n in args.stream_sizes.split(",") if n]
    buffers = [run_child(args.buffer_examples, int(b), args) for b in args.buffer_sizes.split(",") if b]
    if buffers:
        buffers[0]["global_efficiency"] = global_efficiency(args.buffer_examples, args)
    text = markdown(side, stream, buffers, command.strip(), args)
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump({"command": command, "side_by_side": side, "streaming": stream, "buffers": buffers}, f, indent=2)


if __name__ == "__main__":
    main()
