"""Offline packing (``pack_dataset``) against TRL's ``pack_dataset``: in memory, at scale on disk, streaming.

    python benchmarks/cpu/bench_offline.py in-memory --out benchmarks/results/pack_dataset   # a few minutes
    python benchmarks/cpu/bench_offline.py in-memory --examples 20000 --repeats 2 --stream-sizes 10000,50000
    python benchmarks/cpu/bench_offline.py at-scale          # 1M x3 and 3M x2 (about 10 min, 2 cores): results/pack_at_scale_3m
    python benchmarks/cpu/bench_offline.py at-scale --examples 100000 --repeats 1 --out ''   # a quick check
    python benchmarks/cpu/bench_offline.py streaming         # 100k, 300k, 1M examples, 3 repeats; --sizes 20000 --no-write

What each subcommand measures: see docs/benchmarks.md#how-bench_offlinepy-measures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _offline_jobs import CHILDREN, count_of, stream_lengths, token_column  # noqa: E402  (beside this script)
from _shared import DISTRIBUTIONS, alternate, command, machine, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- fresh processes
def spawn(kind: str, **job) -> dict:
    """Run a child in a fresh Python process (its peak RSS is its own); its JSON result."""
    line = [sys.executable, __file__, "--child", json.dumps({"kind": kind, **job})]
    return json.loads(
        subprocess.run(line, check=True, capture_output=True, text=True, cwd=REPO).stdout.splitlines()[-1]
    )


SAMPLE_SECONDS = 0.02


def _status_mib(pid: int) -> dict[str, float]:
    """RssAnon and VmRSS of process ``pid`` (MiB), from /proc; empty where there is none."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return {k: int(v.split()[0]) / 1024 for k, v in (line.split(":", 1) for line in status) if k in _FIELDS}
    except (OSError, ValueError):
        return {}


_FIELDS = ("RssAnon", "VmRSS")


def spawn_sampled(kind: str, **job) -> dict:
    """:func:`spawn`, with the child's anonymous (RssAnon) and total (VmRSS) memory read from here every 20 ms.

    Adds ``anon_peak_mib`` and ``rss_peak_sampled_mib`` (None without /proc), the sample count
    and the load average before and after. The child's own ``peak_rss_mib`` (VmHWM) is the
    exact total peak; nothing counts the anonymous peak for us, hence the sampling.
    """
    line = [sys.executable, __file__, "--child", json.dumps({"kind": kind, **job})]
    load_before = os.getloadavg()
    peaks = {name: None for name in _FIELDS}
    samples = 0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(line, stdout=out, stderr=err, text=True, cwd=REPO)
        while child.poll() is None:
            for name, value in _status_mib(child.pid).items():
                peaks[name] = max(value, peaks[name] or 0.0)
            samples += 1
            time.sleep(SAMPLE_SECONDS)
        out.seek(0), err.seek(0)
        if child.returncode:
            raise subprocess.CalledProcessError(child.returncode, line, out.read(), err.read())
        result = json.loads(out.read().splitlines()[-1])
    return {
        **result,
        "anon_peak_mib": peaks["RssAnon"],
        "rss_peak_sampled_mib": peaks["VmRSS"],
        "samples": samples,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }


def job_of(args, **extra) -> dict:
    return {"dist": args.dist, "seed": args.seed, "max_length": args.max_length, **extra}


# ----------------------------------------------------------------------------- in-memory
def side_by_side(args) -> list[dict]:
    import datasets
    import pyarrow as pa
    import trl
    from datasets.table import InMemoryTable
    from trl import pack_dataset as trl_pack

    from packing_collators import pack_dataset

    datasets.disable_progress_bars()
    column, offsets, total = token_column(args.dist, args.examples, args.seed)
    mask = pa.ListArray.from_arrays(offsets, pa.array(np.ones(total, np.int8)))
    dataset = datasets.Dataset(InMemoryTable(pa.table({"input_ids": column, "attention_mask": mask})))
    results = []
    for strategy in args.strategies.split(","):
        runners = {
            "packing_collators": lambda s=strategy: pack_dataset(dataset, args.max_length, strategy=s),
            f"trl {trl.__version__}": lambda s=strategy: trl_pack(dataset, args.max_length, strategy=s),
        }
        outputs = {}
        times = alternate(
            {name: lambda n=name, r=run: outputs.__setitem__(n, r()) for name, run in runners.items()}, args.repeats
        )
        for name, packed in outputs.items():
            tokens = count_of(packed, "input_ids")
            assert tokens == total, (name, tokens, total)
            results.append(
                {
                    "strategy": strategy,
                    "implementation": name,
                    "median_s": statistics.median(times[name]),
                    "times_s": times[name],
                    "rows": len(packed),
                    "lower_bound_rows": math.ceil(total / args.max_length),
                    "efficiency": tokens / (len(packed) * args.max_length),
                }
            )
    return results


def markdown_in_memory(side, stream, buffers, cmd, args) -> str:
    ours = {r["strategy"]: r for r in side if r["implementation"] == "packing_collators"}
    lines = [
        "# pack_dataset: packing_collators vs TRL",
        "",
        f"Command: `{cmd}`",
        "",
        f"{args.examples:,} `{args.dist}` examples (input_ids int32 + attention_mask int8, in memory), capacity "
        f"{args.max_length}; {args.repeats} repeats alternating, median. CPU, 2 shared cores: compare the ratio.",
        "",
        "| strategy | implementation | median time (s) | speed-up | rows | lower bound | efficiency |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in side:
        speedup = r["median_s"] / ours[r["strategy"]]["median_s"]
        mine = r["implementation"] == "packing_collators"
        lines.append(
            f"| {r['strategy']} | {r['implementation']} | {r['median_s']:.3f} | "
            f"{'1.00x (ours)' if mine else f'ours {speedup:.1f}x faster'} | "
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
        lines += [
            f"| {r['examples']:,} | {r['rows']:,} | {r['efficiency']:.4%} | {r['seconds']:.1f} | "
            f"{r['peak_rss_mib']:.0f} |"
            for r in stream
        ]
    if buffers:
        lines += [
            "",
            f"## Efficiency cost of the buffer ({buffers[0]['examples']:,} `{args.dist}` examples)",
            "",
            "| buffer_size | rows | lower bound | efficiency | peak RSS (MiB) |",
            "|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['buffer_size']:,} | {r['rows']:,} | {r['lower_bound_rows']:,} | {r['efficiency']:.4%} | "
            f"{r['peak_rss_mib']:.0f} |"
            for r in buffers
        ]
        lines.append(f"| global (in memory) | | | {buffers[0]['global_efficiency']:.4%} | |")
    return "\n".join(lines) + "\n"


def run_in_memory(args) -> None:
    from packing_collators import pack_lengths

    cmd, side = command(), side_by_side(args)
    stream = [
        spawn("stream", **job_of(args, n=int(n), strategy="bfd", buffer_size=args.buffer_size))
        for n in args.stream_sizes.split(",")
        if n
    ]
    buffers = [
        spawn("stream", **job_of(args, n=args.buffer_examples, strategy="bfd", buffer_size=int(b)))
        for b in args.buffer_sizes.split(",")
        if b
    ]
    if buffers:  # global (in-memory) bfd on the same lengths as the stream: the buffer table's reference row
        lengths = np.concatenate(stream_lengths(args.buffer_examples, job_of(args)))
        buffers[0]["global_efficiency"] = pack_lengths(lengths, args.max_length).efficiency
    text = markdown_in_memory(side, stream, buffers, cmd, args)
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text)
        data = {"command": cmd, "side_by_side": side, "streaming": stream, "buffers": buffers}
        Path(args.out + ".json").write_text(json.dumps(data, indent=2))


# ----------------------------------------------------------------------------- at-scale
def run_pack(packer: str, data: Path, args, strategy: str = "bfd", max_length: int | None = None) -> dict:
    result = spawn_sampled(
        "pack",
        packer=packer,
        data=str(data),
        strategy=strategy,
        num_proc=args.num_proc,
        max_length=max_length or args.max_length,
    )
    anon = result["anon_peak_mib"]
    print(
        f"  {packer:<18} {strategy:<9} {result['seconds']:8.1f} s  anonymous peak "
        f"{'-' if anon is None else f'{anon:,.0f}'} MiB  total peak {result['peak_rss_mib']:8,.0f} MiB  "
        f"rows {result['rows']:,}  efficiency {result['efficiency']:.4%}  load {result['loadavg_before'][0]:.1f}"
        f"{'  ' + '; '.join(result['log']) if result['log'] else ''}",
        flush=True,
    )
    return result


def clear_caches(data: Path) -> None:
    """Delete every cache file, and flush the writes so far: each run starts with no dirty pages to write back."""
    for path in data.glob("cache-*"):
        path.unlink()
    os.sync()


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measure_size(n: int, repeats: int, work: Path, args) -> dict:
    data = work / f"sft_{n}"
    print(f"{n:,} examples: building {data}", flush=True)
    info = spawn("build", n=n, data=str(data))
    runs = {"packing_collators": [], "packing_collators cache hit": [], "trl": []}
    sequence = []  # the runs' names in the order they ran
    for repeat in range(repeats):
        for packer in ("ours", "trl") if repeat % 2 == 0 else ("trl", "ours"):
            clear_caches(data)
            names = ["trl"] if packer == "trl" else ["packing_collators", "packing_collators cache hit"]
            for name in names:
                runs[name].append(run_pack(name.split()[0], data, args))
                sequence.append(name)
    split = {}
    if n == args.split_examples:
        for packer in ("packing_collators", "trl"):
            clear_caches(data)
            split[packer] = run_pack(packer, data, args, "bfd_split", args.split_max_length)
    clear_caches(data)
    if not args.keep_data:
        shutil.rmtree(data)
    keys = ("seconds", "peak_rss_mib", "anon_peak_mib", "anon_before_mib")
    med = {name: {key: _median(r[key] for r in rs) for key in keys} for name, rs in runs.items()}
    speedup = med["trl"]["seconds"] / med["packing_collators"]["seconds"]
    return {
        **info, "repeats": repeats, "runs": runs, "sequence": sequence, "median": med, "speedup_vs_trl": speedup,
        "split": split,
    }  # fmt: skip


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _every_run(results: list[dict]):
    """(examples, packer, run) of every pack, in the order they ran (timed packs, cache hits, split)."""
    for r in results:
        seen = dict.fromkeys(r["runs"], 0)
        for name in r["sequence"]:
            yield r["examples"], name, r["runs"][name][seen[name]]
            seen[name] += 1
        for name, run in r["split"].items():
            yield r["examples"], f"{name} split", run


def _path(run: dict) -> str:
    """How pack_dataset wrote its rows (its log): in one pass from the mapped input, or in two through temp files."""
    log = " ".join(run.get("log", []))
    return "one pass" if "one pass" in log else "two passes" if "two passes" in log else ""


def _growth(results: list[dict]) -> list[str]:
    """How each packer's anonymous peak grows with the examples: bytes per example between the two ends."""
    small, large = min(results, key=lambda r: r["examples"]), max(results, key=lambda r: r["examples"])
    if small is large:
        return []
    lines = [
        "",
        f"## Growth of the anonymous peak, {small['examples']:,} -> {large['examples']:,} examples",
        "",
        "The slope between the two sizes is the memory per example (the plan, the lengths); what is left "
        "at zero examples is the process before the call (Python, pyarrow, datasets, the packer's imports) "
        "plus the rows in flight.",
        "",
        "| packer | anonymous peak (MiB) | bytes per example | at 0 examples (MiB) | anonymous before the call (MiB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ("packing_collators", "trl"):
        low, high = small["median"][name]["anon_peak_mib"], large["median"][name]["anon_peak_mib"]
        if low is None or high is None:
            continue
        slope = (high - low) * 2**20 / (large["examples"] - small["examples"])
        lines.append(
            f"| {name} | {low:,.0f} -> {high:,.0f} | {slope:,.0f} | {low - slope * small['examples'] / 2**20:,.0f} "
            f"| {_mib(large['median'][name]['anon_before_mib'])} |"
        )
    return lines


def markdown_at_scale(results: list[dict], args) -> str:
    loads = [load[0] for _, _, run in _every_run(results) for load in (run["loadavg_before"], run["loadavg_after"])]
    lines = [
        "# Offline packing at scale: pack_dataset (on disk) vs TRL pack_dataset",
        "",
        f"Command: `{command()}`",
        "",
        f"Machine: {machine()}, 2 cores, 24 GiB RAM, no swap, shared with other work: load average (1 minute) "
        f"{min(loads):.1f} to {max(loads):.1f} during the runs. Data: `sft` examples, `input_ids` + `labels` int32, "
        f"saved in `save_to_disk`'s layout; each run is a fresh process that imports the packer, calls "
        f"`load_from_disk`, then packs at capacity {args.max_length} (the seconds are that call's). Memory of that "
        "process: the **anonymous peak** is the largest `RssAnon` (heap and arrays: what the packer holds), read "
        "from `/proc/<pid>/status` every 20 ms; the **total peak** is `VmHWM`, the RSS including mapped file "
        "pages (the memory-mapped input and output: clean, file-backed pages the kernel can drop). Medians over "
        "the repeats, packers alternating; compare the ratio, not the seconds.",
        "",
        "| examples | tokens | on disk (GiB) | repeats | ours (s) | TRL bfd (s) | speedup "
        "| anonymous peak ours / TRL (MiB) | total peak ours / TRL (MiB) | cache hit (s) | efficiency ours / TRL |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        m = r["median"]
        ours, trl = m["packing_collators"], m["trl"]
        lines.append(
            f"| {r['examples']:,} | {r['tokens']:,} | {r['bytes_on_disk'] / 2**30:.2f} | {r['repeats']} "
            f"| {ours['seconds']:.1f} | {trl['seconds']:.1f} | {r['speedup_vs_trl']:.2f}x "
            f"| {_mib(ours['anon_peak_mib'])} / {_mib(trl['anon_peak_mib'])} "
            f"| {ours['peak_rss_mib']:,.0f} / {trl['peak_rss_mib']:,.0f} "
            f"| {m['packing_collators cache hit']['seconds']:.2f} "
            f"| {r['runs']['packing_collators'][0]['efficiency']:.4%} / {r['runs']['trl'][0]['efficiency']:.4%} |"
        )
    lines += _growth(results)
    for r in (r for r in results if r["split"]):
        lines += [
            "",
            f"## overflow='split' vs TRL strategy='bfd_split' ({r['examples']:,} examples, capacity "
            f"{args.split_max_length}, {r['tokens']:,} tokens in)",
            "",
            "| packer | tokens out | pieces (segments) | rows | efficiency | seconds | anonymous peak (MiB) "
            "| total peak (MiB) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, s in (
            ("packing_collators overflow='split'", r["split"]["packing_collators"]),
            ("TRL bfd_split", r["split"]["trl"]),
        ):
            lines.append(
                f"| {name} | {s['tokens']:,} | {s['segments']:,} | {s['rows']:,} | {s['efficiency']:.4%} "
                f"| {s['seconds']:.1f} | {_mib(s['anon_peak_mib'])} | {s['peak_rss_mib']:,.0f} |"
            )
    lines += [
        "",
        "## Every run",
        "",
        "In the order they ran (the packers alternate; each of ours is followed by a second call that loads its cache). "
        "Rows written: pack_dataset's log says whether the input's token columns fit in half the available memory "
        "(one pass from the mapped input) or not (two passes through temp files).",
        "",
        "| examples | packer | seconds | anonymous peak (MiB) | anonymous before the call (MiB) | total peak (MiB) "
        "| load average before / after | rows written |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for examples, name, run in _every_run(results):
        lines.append(
            f"| {examples:,} | {name} | {run['seconds']:.2f} | {_mib(run['anon_peak_mib'])} "
            f"| {_mib(run['anon_before_mib'])} | {run['peak_rss_mib']:,.0f} "
            f"| {run['loadavg_before'][0]:.1f} / {run['loadavg_after'][0]:.1f} | {_path(run)} |"
        )
    return "\n".join(lines) + "\n"


def run_at_scale(args) -> None:
    print(command(), flush=True)
    sizes, repeats = [int(x) for x in args.examples.split(",")], [int(x) for x in args.repeats.split(",")]
    work, results = Path(args.workdir or tempfile.mkdtemp(prefix="pack_at_scale_")), []
    try:
        for i, n in enumerate(sizes):
            results.append(measure_size(n, repeats[min(i, len(repeats) - 1)], work, args))
            if args.out:  # after each size, so a long run leaves what it measured
                data = {"command": command(), "machine": machine(), "max_length": args.max_length, "results": results}
                write_results(args.out, markdown_at_scale(results, args), data)
    finally:
        if not args.keep_data and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(markdown_at_scale(results, args))


# ----------------------------------------------------------------------------- streaming
def measure_streaming(args) -> list[dict]:
    """Every (strategy, size), alternating strategies within each repeat; medians of time, max of RSS."""
    strategies = args.strategies.split(",")
    runs: dict[tuple[str, int], list[dict]] = {}
    for repeat in range(args.repeats):
        for n in (int(s) for s in args.sizes.split(",")):
            for strategy in strategies if repeat % 2 == 0 else reversed(strategies):
                result = spawn("stream", **job_of(args, n=n, strategy=strategy, buffer_size=args.buffer_size))
                runs.setdefault((strategy, n), []).append(result)
                print(f"repeat {repeat}: {strategy} {n:,}: {result['seconds']:.1f} s, {result['peak_rss_mib']:.0f} MiB")
    summary = []
    for (strategy, n), results in runs.items():
        seconds, first = statistics.median(r["seconds"] for r in results), results[0]
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


def markdown_streaming(results: list[dict], args, cmd: str) -> str:
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
    lines += [
        "",
        f"| strategy | peak RSS growth {sizes[0]:,} -> {sizes[-1]:,} | wrapped time / bfd time |",
        "|---|---:|---:|",
    ]
    for strategy in dict.fromkeys(r["strategy"] for r in results):
        growth = by[(strategy, sizes[-1])]["peak_rss_mib"] - by[(strategy, sizes[0])]["peak_rss_mib"]
        ratios = [
            by[("wrapped", n)]["seconds"] / by[("bfd", n)]["seconds"]
            for n in sizes
            if strategy == "wrapped" and ("bfd", n) in by
        ]
        lines.append(f"| {strategy} | {growth:+.0f} MiB | {', '.join(f'{x:.2f}x' for x in ratios)} |")
    return "\n".join(lines) + "\n"


def run_streaming(args) -> None:
    cmd, results = command(), measure_streaming(args)
    text = markdown_streaming(results, args, cmd)
    print(text)
    if not args.no_write:
        write_results("streaming", text, {"command": cmd, "machine": machine(), "results": results})


# ----------------------------------------------------------------------------- command line
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    memory = modes.add_parser("in-memory", help="pack_dataset vs TRL in one process, then streaming bfd and buffers")
    memory.add_argument("--examples", type=int, default=200_000)
    memory.add_argument("--repeats", type=int, default=5)
    memory.add_argument("--strategies", default="bfd,wrapped", help="comma-separated, each run by both libraries")
    memory.add_argument("--stream-sizes", default="100000,1000000", help="comma-separated; empty to skip")
    memory.add_argument("--buffer-sizes", default="1000,10000,100000", help="efficiency per buffer size; empty to skip")
    memory.add_argument("--buffer-examples", type=int, default=200_000)
    memory.add_argument(
        "--out", default=None, help="write <out>.md and <out>.json (e.g. benchmarks/results/pack_dataset)"
    )
    scale = modes.add_parser("at-scale", help="load_from_disk then pack, fresh processes, vs TRL; 1M and 3M examples")
    scale.add_argument("--examples", default="1000000,3000000", help="sizes, comma-separated")
    scale.add_argument("--repeats", default="3,2", help="repeats per size, comma-separated (last one repeats)")
    scale.add_argument("--split-max-length", type=int, default=512, help="capacity of the split comparison")
    scale.add_argument("--split-examples", type=int, default=1_000_000, help="the size the split comparison runs at")
    scale.add_argument("--num-proc", type=int, default=None, help="pack_dataset's num_proc (default: one process)")
    scale.add_argument("--workdir", default=None, help="where the data goes (default: a temporary folder)")
    scale.add_argument("--keep-data", action="store_true")
    scale.add_argument("--out", default="pack_at_scale_3m", help="results/<out>.md and .json ('' to skip)")
    streaming = modes.add_parser("streaming", help="wrapped and bfd on a growing generator: peak RSS and speed")
    streaming.add_argument("--sizes", default="100000,300000,1000000", help="comma-separated example counts")
    streaming.add_argument("--strategies", default="wrapped,bfd,source", help="'source' reads the generator only")
    streaming.add_argument("--repeats", type=int, default=3)
    streaming.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results/")
    for mode in (memory, scale, streaming):
        mode.add_argument("--max-length", type=int, default=2048)
        mode.add_argument("--dist", choices=sorted(DISTRIBUTIONS), default="sft")
        mode.add_argument("--seed", type=int, default=0)
        mode.add_argument("--buffer-size", type=int, default=10_000, help="pack_dataset's streaming buffer")
    return parser.parse_args(argv)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        job = json.loads(sys.argv[2])
        print(json.dumps(CHILDREN[job.pop("kind")](job)))
        return
    args = parse_args()
    {"in-memory": run_in_memory, "at-scale": run_at_scale, "streaming": run_streaming}[args.mode](args)


if __name__ == "__main__":
    main()
