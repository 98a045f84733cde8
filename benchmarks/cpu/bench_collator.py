"""Benchmark FlatteningCollator against transformers' DataCollatorWithFlattening.

Both get the same 64-example batches of the `sft` length distribution and return the same
values (input_ids, labels, position_ids, cu_seq_lens_q/k, max_length_q/k, torch tensors);
transformers' with `return_flash_attn_kwargs=True`. Inputs are given as Python lists (what a
`datasets.Dataset` yields by default) and as numpy arrays (`dataset.with_format("numpy")`).

Usage: python benchmarks/cpu/bench_collator.py [--batches 40] [--batch-size 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from transformers import DataCollatorWithFlattening

from packing_collators import FlatteningCollator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import alternate, command, lengths_of, machine, median, write_results  # noqa: E402


def make_batches(num_batches: int, batch_size: int, kind: str) -> list[list[dict]]:
    rng = np.random.default_rng(0)
    lengths = lengths_of("sft", num_batches * batch_size)
    batches = []
    for b in range(num_batches):
        batch = []
        for n in lengths[b * batch_size : (b + 1) * batch_size]:
            ids = rng.integers(0, 32000, n)
            labels = ids.copy()
            labels[: n // 3] = -100
            if kind == "list":
                batch.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
            else:
                batch.append({"input_ids": ids, "labels": labels})
        batches.append(batch)
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    ours, theirs = FlatteningCollator(), DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    rows, data = [], {"machine": machine(), "command": command(), "batch_size": args.batch_size}
    for kind in ("list", "numpy"):
        batches = make_batches(args.batches, args.batch_size, kind)
        tokens = sum(len(f["input_ids"]) for batch in batches for f in batch)
        times = alternate(
            {"ours": lambda: [ours(b) for b in batches], "transformers": lambda: [theirs(b) for b in batches]},
            args.repeats,
        )
        ours_tps, theirs_tps = tokens / median(times["ours"]), tokens / median(times["transformers"])
        rows.append(
            f"| {kind} | {ours_tps / 1e6:.1f} M | {theirs_tps / 1e6:.2f} M | **{ours_tps / theirs_tps:.1f}x** |"
        )
        data[kind] = {
            "ours_tokens_per_s": ours_tps,
            "transformers_tokens_per_s": theirs_tps,
            "ratio": ours_tps / theirs_tps,
        }
    markdown = (
        "\n".join(
            [
                f"## FlatteningCollator vs DataCollatorWithFlattening: {args.batches} batches of {args.batch_size} `sft` examples",
                "",
                f"Machine: {machine()}. Median of {args.repeats} alternating runs over all batches. Command: `{command()}`",
                "",
                "| inputs | ours (tokens/s) | transformers (tokens/s) | ratio |",
                "|---|---|---|---|",
                *rows,
            ]
        )
        + "\n"
    )
    print(markdown)
    write_results("collator", markdown, data)


if __name__ == "__main__":
    main()
