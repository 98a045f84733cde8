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
    "Scripts folded into harnesses since (issue #27): `bench_pack_dataset.py`, `bench_pack_at_scale.py` a"
    "nd `bench_streaming.py` are `benchmarks/cpu/bench_offline.py in-memory`, `at-scale` and `streaming`;"
    " `trainer_scaling.py`, `distributed_scaling.py` and `trainer_setups.py` are `benchmarks/gpu/distribu"
    "ted.py` (`--runner loop` for the second, `--setup` / `--compare-setups` / `--liger` for the third); "
    "`gpu_attention_check.py` and `fa4_check.py` are `benchmarks/gpu/exactness.py at"
    "tention` and `fa4`; `architecture_sweep.py` is `scripts/architecture_sweep.py`. The one-off investig"
    "ations (`attention_host_cost`, `oracle_gap`, `packed_kernels`, `varlen_kernels`, `gpu_varlen_gqa_che"
    "ck`, `fa4_compiles`, `probe_check`, `memory_budget`, `trainer_memory_check`, `rank_balance`, `long_c"
    "ontext_report`) were deleted; their findings are in docs/benchmarks.md, and a command naming one run"
    "s as written in a checkout of commit 77bb1bb (`git worktree add ../pc-77bb1bb 77bb1bb`). Commands re"
    "corded inside the results' own .json and .log files are the ones that ran, unchanged."
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
