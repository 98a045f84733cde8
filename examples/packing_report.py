"""How much padding does packing save? A report on a realistic synthetic dataset.

Draws example lengths from the standard distributions (seeded), then compares:
- padding: batches of --batch-size examples padded to their longest, in random order and
  length-grouped (what `group_by_length` does);
- packing into rows of --max-length tokens with each strategy of `pack_lengths`.

Usage: python examples/packing_report.py [--examples 100000] [--max-length 2048] [--batch-size 8]

No GPU is used (no model, no training), on any machine: start it with plain ``python``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from packing_collators import pack_lengths

DISTRIBUTIONS = {
    "sft": (5.3, 0.9, 8),
    "flan_like": (4.6, 0.8, 8),
    "orcamath_like": (6.0, 0.5, 32),
}


def padded_efficiency(lengths: np.ndarray, batch_size: int, grouped: bool, seed: int = 0) -> float:
    """Real tokens / padded tokens when batches are padded to their longest example.

    Length-grouped follows transformers' `group_by_length`: shuffle, cut into megabatches of
    50 batches, sort each megabatch by length.
    """
    order = np.random.default_rng(seed).permutation(len(lengths))
    if grouped:
        mega = 50 * batch_size
        order = np.concatenate(
            [
                chunk[np.argsort(-lengths[chunk], kind="stable")]
                for chunk in np.split(order, range(mega, len(order), mega))
            ]
        )
    usable = len(order) - len(order) % batch_size
    batches = lengths[order[:usable]].reshape(-1, batch_size)
    return float(batches.sum() / (batches.max(axis=1) * batch_size).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8, help="examples per padded batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    for name, (mean, sigma, low) in DISTRIBUTIONS.items():
        lengths = np.clip(rng.lognormal(mean, sigma, args.examples), low, args.max_length).astype(np.int64)
        print(
            f"\n{name}: {args.examples:,} examples, {lengths.sum():,} tokens, mean {lengths.mean():.0f}, "
            f"median {np.median(lengths):.0f}, max {lengths.max()}"
        )
        print(f"  {'layout':<34}{'efficiency':>11}{'waste':>8}{'rows':>10}{'time':>9}")
        for grouped in (False, True):
            eff = padded_efficiency(lengths, args.batch_size, grouped, args.seed)
            label = f"padded, {args.batch_size}/batch, " + ("length-grouped" if grouped else "random order")
            print(f"  {label:<34}{eff:>10.1%}{1 - eff:>8.1%}{'':>10}{'':>9}")
        for strategy in ("next_fit", "ffd", "bfd"):
            start = time.perf_counter()
            result = pack_lengths(lengths, args.max_length, strategy=strategy)
            seconds = time.perf_counter() - start
            label = f"packed {strategy} into {args.max_length}"
            print(
                f"  {label:<34}{result.efficiency:>10.2%}{1 - result.efficiency:>8.2%}"
                f"{result.num_rows:>10,}{seconds * 1000:>7.0f}ms"
            )
        print(f"  lower bound: {result.lower_bound_rows:,} rows")


if __name__ == "__main__":
    main()
