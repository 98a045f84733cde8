"""Shared pieces of the benchmark scripts: the standard length distributions and timing.

The distributions are the ones in the project's BENCHMARKS.md (seeded, so every run sees
the same data). Timing alternates the contenders, repeats, and reports medians.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def lengths_of(distribution: str, n: int, seed: int = 0) -> np.ndarray:
    """Token counts per example for one of the standard distributions."""
    rng = np.random.default_rng(seed)
    if distribution == "sft":
        x = np.clip(rng.lognormal(5.3, 0.9, n), 8, 2048)
    elif distribution == "flan_like":
        x = np.clip(rng.lognormal(4.6, 0.8, n), 8, 2048)
    elif distribution == "orcamath_like":
        x = np.clip(rng.lognormal(6.0, 0.5, n), 32, 2048)
    elif distribution == "long_tail":
        tail = rng.random(n) < 0.05
        x = np.where(tail, rng.uniform(1500, 8192, n), rng.lognormal(5.0, 0.7, n))
        x = np.clip(x, 1, 8192)
    else:
        raise ValueError(f"unknown distribution {distribution!r}")
    return x.astype(np.int64)


def alternate(contenders: dict, repeats: int) -> dict[str, list[float]]:
    """Run each callable once per round, in alternating order; seconds per call, per contender."""
    times = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else reversed(names):
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median(values) -> float:
    return statistics.median(values)


def machine() -> str:
    return f"{platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}"


def command() -> str:
    """The command line that reproduces this run, from the repository root."""
    script = Path(sys.argv[0]).resolve().relative_to(Path(__file__).resolve().parent.parent)
    return " ".join(["python", str(script), *sys.argv[1:]])


def write_results(name: str, markdown: str, data: dict) -> None:
    """Write results/<name>.md and results/<name>.json and say where."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(markdown)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nwrote {RESULTS / (name + '.md')} and .json")
