"""Assemble benchmarks/RESULTS.md from the per-benchmark files in benchmarks/results/*.md.

Each benchmark script writes its own results/<name>.md (with the command that produced it);
this only concatenates them in a fixed order, so RESULTS.md never holds a number no script printed.
GPU runs keep their files in a folder per run; the ones named with a folder in ORDER (the
long-context table, the rank-balance runs) join in too.

Usage: python benchmarks/collect_results.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = [
    "engine",
    "collator",
    "pack_dataset",
    "pack_at_scale_3m",
    "streaming",
    "sampler",
    "cli_analyze",
    "gpu_attention",
    "train_throughput",
    "long_context_h100/long_context",
    "rank_balance_h100x2/long_tail_8192",
    "rank_balance_h100x2/reasoning_32768",
]
# GPU runs keep their files in a folder per run; these of them join RESULTS.md too
FROM_FOLDERS = [name for name in ORDER if "/" in name]
NOTE = (
    "The CPU reports come from `benchmarks/cpu/bench_engine.py`, `bench_collator.py`, `bench_offline.py` "
    "(`in-memory`: pack_dataset, `at-scale`: pack_at_scale, `streaming`: streaming), `bench_sampler.py` and "
    "`bench_cli_analyze.py`; the GPU ones from `benchmarks/gpu/`, each folder's command and card in "
    "[GPU_RUNS.md](results/GPU_RUNS.md). Some GPU folders come from one-off scripts kept at commit 77bb1bb "
    "(`git worktree add ../pc-77bb1bb 77bb1bb`; [docs/benchmarks.md](../docs/benchmarks.md#the-harnesses-and-make-bench-gpu)). "
    "Commands recorded inside the results' own .json and .log files are the ones that ran."
)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    results = HERE / "results"
    files = [*results.glob("*.md"), *(results / f"{name}.md" for name in FROM_FOLDERS)]

    def rank(path: Path) -> tuple[int, str]:
        name = path.relative_to(results).with_suffix("").as_posix()
        return ORDER.index(name) if name in ORDER else 99, name

    files = sorted(files, key=rank)
    parts = [
        "# Benchmark results",
        "",
        "Written by `python benchmarks/collect_results.py` from `benchmarks/results/*.md`;",
        "each section names the command and the machine that produced it.",
        "",
        NOTE,
        "",
    ]
    parts += [f.read_text().strip() + "\n" for f in files]
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    print(f"wrote {HERE / 'RESULTS.md'} from {len(files)} result file(s)")


if __name__ == "__main__":
    main()
