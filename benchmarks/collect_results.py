"""Assemble benchmarks/RESULTS.md from the per-benchmark files in benchmarks/results/*.md.

Each benchmark script writes its own results/<name>.md (with the command that produced it);
this only concatenates them in a fixed order, so RESULTS.md never holds a number no script printed.

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
    "pack_at_scale",
    "streaming",
    "sampler",
    "cli_analyze",
    "gpu_attention",
    "train_throughput",
]


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    files = sorted(
        (HERE / "results").glob("*.md"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else 99, p.stem)
    )
    parts = [
        "# Benchmark results",
        "",
        "Written by `python benchmarks/collect_results.py` from `benchmarks/results/*.md`;",
        "each section names the command and the machine that produced it.",
        "",
    ]
    parts += [f.read_text().strip() + "\n" for f in files]
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    print(f"wrote {HERE / 'RESULTS.md'} from {len(files)} result file(s)")


if __name__ == "__main__":
    main()
