"""Benchmark `packing-collators analyze` on 1,000,000 pre-tokenized `sft` lengths.

Writes the lengths (a `length` column) to a parquet file in a temporary folder, then times:
- end to end: the installed console script `packing-collators analyze FILE --column length
  --max-length 2048` in a subprocess (Python start, imports, reading, analysis, printing);
- start-up alone: a subprocess that only imports `packing_collators.cli` and what the command
  imports before it reads anything (so end to end minus this is the command's own work);
- in-process: reading the lengths (`open_dataset` + `read_lengths`) and `analyze_lengths`,
  and the library calls inside it (each `pack_lengths` strategy, the sampler's epoch plan).
The subprocess runs alternate (end to end, start-up, ...) and the medians are reported.

Usage: python benchmarks/cpu/bench_cli_analyze.py [--examples 1000000] [--max-length 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import alternate, command, lengths_of, machine, median, write_results  # noqa: E402

STARTUP = "import packing_collators.cli, packing_collators.cli._analysis, packing_collators.cli._input_data, datasets"


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    value = function()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from packing_collators import pack_lengths
    from packing_collators.cli._analysis import analyze_lengths
    from packing_collators.cli._input_data import open_dataset, read_lengths
    from packing_collators.sampler._epoch_plan import plan_epoch

    script = Path(sys.executable).with_name("packing-collators")
    if not script.exists():
        sys.exit(f"{script} is missing: install the package first (`make install`, or `pip install packing-collators`).")
    lengths = lengths_of("sft", args.examples)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sft_lengths.parquet"
        pq.write_table(pa.table({"length": lengths}), path)
        cli = [str(script), "analyze", str(path), "--column", "length", "--max-length", str(args.max_length)]
        outputs = {}

        def end_to_end():
            done = subprocess.run(cli, capture_output=True, text=True, check=True)
            outputs["table"] = done.stdout.replace(str(path), path.name)

        times = alternate(
            {"end to end": end_to_end, "start-up": lambda: subprocess.run([sys.executable, "-c", STARTUP], check=True)},
            args.repeats,
        )
        import datasets  # noqa: F401  (its import is start-up, measured above; not reading)

        read_s, (read_lengths, _, _) = timed(lambda: read_lengths(open_dataset(str(path)), column="length"))
        assert np.array_equal(read_lengths, lengths)
        analysis_runs = [timed(lambda: analyze_lengths(lengths, args.max_length)) for _ in range(args.repeats)]
        analysis_s = median([seconds for seconds, _ in analysis_runs])
        analysis = analysis_runs[0][1]

        def median_s(call) -> float:
            return median([timed(call)[0] for _ in range(args.repeats)])

        parts = {
            f"pack_lengths {strategy}": median_s(lambda s=strategy: pack_lengths(lengths, args.max_length, strategy=s))
            for strategy in ("bfd", "ffd", "next_fit")
        }
        budget = 8 * args.max_length
        parts[f"plan_epoch({budget:,}) (the sampler's plan)"] = median_s(
            lambda: plan_epoch(lengths, budget, num_replicas=1, overflow="drop").stats()
        )

    total_s, startup_s = median(times["end to end"]), median(times["start-up"])
    load = os.getloadavg()[0]
    print(outputs["table"])
    rows = [
        (
            f"`packing-collators analyze FILE --column length --max-length {args.max_length}`, end to end (subprocess)",
            total_s,
        ),
        ("  start-up alone: Python + imports (`import packing_collators, datasets`)", startup_s),
        ("  the command's own work (end to end - start-up)", total_s - startup_s),
        ("in-process: read the lengths (`open_dataset` + `read_lengths`)", read_s),
        ("in-process: `analyze_lengths` (padding x2, bfd, ffd, next_fit, wrapped, sampler)", analysis_s),
        *((f"  of which `{name}`", seconds) for name, seconds in parts.items()),
    ]
    markdown = "\n".join(
        [
            f"## `packing-collators analyze`: {args.examples:,} `sft` lengths (a `length` column), max length {args.max_length:,}",
            "",
            f"Machine: {machine()}, {os.cpu_count()} cores, shared and noisy (load average {load:.1f} at the end). Median of {args.repeats} runs (subprocesses alternating). "
            f"Command: `{command()}`",
            "",
            "| what | time (s) |",
            "|---|---|",
            *(
                f"| {name.strip() if not name.startswith('  ') else '&nbsp;&nbsp;' + name.strip()} | {seconds:.2f} |"
                for name, seconds in rows
            ),
            "",
            f"The analysis itself takes **{analysis_s:.1f} s** for {args.examples:,} examples; end to end the command "
            f"takes {total_s:.1f} s, {startup_s / total_s:.0%} of it starting Python and importing the package and "
            "datasets (torch is not imported: the sampler and the Trainer wiring load lazily). "
            "What it printed (bfd rows: "
            f"{analysis.packing('bfd').rows:,}, lower bound {analysis.packing('bfd').lower_bound:,}):",
            "",
            "```",
            outputs["table"].rstrip(),
            "```",
            "",
        ]
    )
    for name, seconds in rows:
        print(f"{seconds:8.2f} s  {name}")
    write_results(
        "cli_analyze",
        markdown,
        {
            "command": command(),
            "machine": machine(),
            "examples": args.examples,
            "max_length": args.max_length,
            "repeats": args.repeats,
            "load_average": load,
            "end_to_end_s": total_s,
            "startup_s": startup_s,
            "end_to_end_runs_s": times["end to end"],
            "startup_runs_s": times["start-up"],
            "read_lengths_s": read_s,
            "analyze_lengths_s": analysis_s,
            "parts_s": parts,
            "analysis": analysis.as_dict(),
        },
    )


if __name__ == "__main__":
    main()
