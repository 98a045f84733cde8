"""Offline packing at scale: pack_dataset on disk vs TRL's pack_dataset, fresh processes, side by side.

For each size, ``sft`` examples (``input_ids`` and ``labels``, int32) are written into a
temporary folder as ``save_to_disk`` lays them out (Arrow stream files of about 500 MB); then each packer runs in a fresh process that does
``load_from_disk`` then packs (capacity 2048), alternating packers across repeats. Reported per
run: seconds in the pack call, the process's peak RSS (``ru_maxrss``: file-backed mapped pages
count too), rows, efficiency, and whether the result is backed by cache files. After each of
our runs a second fresh process makes the same call and must load the cache (its seconds are
the cache-hit time). TRL packs with ``map_kwargs={"load_from_cache_file": False}`` so it really
packs; every cache file is deleted between runs. Then ``overflow="split"`` vs TRL's
``strategy="bfd_split"`` at a smaller capacity (``--split-max-length``, where ``sft`` has
examples too long): tokens in and out, pieces, rows and efficiency. The data is deleted at the end.

    python benchmarks/cpu/bench_pack_at_scale.py                             # 1M x3 and 3M x1 (about 40 min, 2 cores)
    python benchmarks/cpu/bench_pack_at_scale.py --examples 100000 --repeats 1 --out ''   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import command, machine, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def build_data(n: int, folder: Path, seed: int) -> dict:
    """``n`` sft examples saved with save_to_disk (run in a child: its memory is not the packers')."""
    import datasets
    import numpy as np
    import pyarrow as pa
    from datasets.table import InMemoryTable

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _shared import lengths_of

    lengths = lengths_of("sft", n, seed)
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    tokens = np.random.default_rng(seed + 1).integers(0, 32000, int(lengths.sum()), dtype=np.int32)
    column = pa.ListArray.from_arrays(offsets, pa.array(tokens))
    table = pa.table({"input_ids": column, "labels": column})
    # save_to_disk copies a table this size (3M examples ran out of 24 GiB): write its layout directly,
    # Arrow stream files of 1,000-row batches, about 500 MB each, listed in its state.json
    datasets.disable_progress_bars()
    datasets.Dataset(InMemoryTable(table.slice(0, 1))).save_to_disk(str(folder))
    for path in folder.glob("data-*.arrow"):
        path.unlink()
    count = max(1, round(table.nbytes / 500e6))
    edges = np.linspace(0, n, count + 1).astype(int)
    names = [f"data-{i:05d}-of-{count:05d}.arrow" for i in range(count)]
    for name, first, last in zip(names, edges[:-1], edges[1:]):
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.slice(first, last - first).to_batches(max_chunksize=1000):
                writer.write_batch(batch)
    state = json.loads((folder / "state.json").read_text())
    state.update(_data_files=[{"filename": name} for name in names], _fingerprint=f"sft-{n}-{seed}")
    (folder / "state.json").write_text(json.dumps(state))
    size = sum(f.stat().st_size for f in folder.glob("*.arrow"))
    return {"examples": n, "tokens": int(lengths.sum()), "bytes_on_disk": size}


def child(args) -> dict:
    """One packing in this (fresh) process: load_from_disk, then the packer; what it took."""
    import resource
    import time

    import datasets
    import pyarrow.compute as pc

    datasets.disable_progress_bars()
    dataset = datasets.load_from_disk(args.data)
    start = time.perf_counter()
    if args.packer == "trl":
        from trl import pack_dataset as trl_pack

        packed = trl_pack(dataset, args.max_length, strategy=args.strategy, map_kwargs={"load_from_cache_file": False})
    else:
        from packing_collators import pack_dataset

        overflow = "split" if args.strategy == "bfd_split" else "error"
        packed = pack_dataset(dataset, args.max_length, overflow=overflow, num_proc=args.num_proc)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    table = packed.data.table
    tokens = int(pc.sum(pc.list_value_length(table.column("input_ids"))).as_py())
    segments = int(pc.sum(pc.list_value_length(table.column("seq_lengths"))).as_py())
    return {
        "seconds": seconds,
        "peak_rss_mib": peak,
        "rows": len(packed),
        "tokens": tokens,
        "segments": segments,
        "efficiency": tokens / (len(packed) * args.max_length),
        "cache_files": len(packed.cache_files),
    }


def run_child(packer: str, data: Path, args, strategy: str = "bfd", max_length: int | None = None) -> dict:
    line = [sys.executable, __file__, "--child", "--packer", packer, "--data", str(data), "--strategy", strategy]
    line += ["--max-length", str(max_length or args.max_length)]
    line += ["--num-proc", str(args.num_proc)] if args.num_proc else []
    result = json.loads(subprocess.run(line, check=True, capture_output=True, text=True, cwd=REPO).stdout)
    print(
        f"  {packer:<18} {strategy:<9} {result['seconds']:8.1f} s  peak RSS {result['peak_rss_mib']:8.0f} MiB  "
        f"rows {result['rows']:,}  efficiency {result['efficiency']:.4%}",
        flush=True,
    )
    return result


def clear_caches(data: Path) -> None:
    """Delete every cache file, and flush the writes so far: each run starts with no dirty pages to write back."""
    for path in data.glob("cache-*"):
        path.unlink()
    os.sync()


def measure_size(n: int, repeats: int, work: Path, args) -> dict:
    data = work / f"sft_{n}"
    print(f"{n:,} examples: building {data}", flush=True)
    info = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--build", str(n), "--data", str(data)],
            check=True,
            capture_output=True,
            text=True,
            cwd=REPO,
        ).stdout
    )
    runs = {"packing_collators": [], "packing_collators cache hit": [], "trl": []}
    for repeat in range(repeats):
        for packer in ("ours", "trl") if repeat % 2 == 0 else ("trl", "ours"):
            clear_caches(data)
            if packer == "trl":
                runs["trl"].append(run_child("trl", data, args))
                continue
            runs["packing_collators"].append(run_child("packing_collators", data, args))
            runs["packing_collators cache hit"].append(run_child("packing_collators", data, args))
    split = {}
    if n == args.split_examples:
        for packer in ("packing_collators", "trl"):
            clear_caches(data)
            split[packer] = run_child(packer, data, args, "bfd_split", args.split_max_length)
    clear_caches(data)
    if not args.keep_data:
        shutil.rmtree(data)
    med = {
        name: {key: statistics.median(r[key] for r in rs) for key in ("seconds", "peak_rss_mib")}
        for name, rs in runs.items()
    }
    return {
        **info,
        "repeats": repeats,
        "runs": runs,
        "median": med,
        "speedup_vs_trl": med["trl"]["seconds"] / med["packing_collators"]["seconds"],
        "split": split,
    }


def markdown(results: list[dict], args) -> str:
    lines = [
        "# Offline packing at scale: pack_dataset (on disk) vs TRL pack_dataset",
        "",
        f"Command: `{command()}`",
        "",
        f"Machine: {machine()}, 2 cores, 24 GiB RAM, no swap. Data: `sft` examples, `input_ids` + `labels` int32, "
        f"saved in `save_to_disk`'s layout, then `load_from_disk` in a fresh process per run; capacity {args.max_length}; "
        "peak RSS = `ru_maxrss` of that process (mapped file pages included). Medians over the repeats, "
        "packers alternating.",
        "",
        "| examples | tokens | on disk (GiB) | repeats | ours (s) | TRL bfd (s) | speedup | ours peak RSS (MiB) "
        "| TRL peak RSS (MiB) | cache hit (s) | ours efficiency | TRL efficiency |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        m = r["median"]
        lines.append(
            f"| {r['examples']:,} | {r['tokens']:,} | {r['bytes_on_disk'] / 2**30:.2f} | {r['repeats']} "
            f"| {m['packing_collators']['seconds']:.1f} | {m['trl']['seconds']:.1f} | {r['speedup_vs_trl']:.2f}x "
            f"| {m['packing_collators']['peak_rss_mib']:,.0f} | {m['trl']['peak_rss_mib']:,.0f} "
            f"| {m['packing_collators cache hit']['seconds']:.2f} "
            f"| {r['runs']['packing_collators'][0]['efficiency']:.4%} | {r['runs']['trl'][0]['efficiency']:.4%} |"
        )
    for r in results:
        if not r["split"]:
            continue
        ours, trl = r["split"]["packing_collators"], r["split"]["trl"]
        lines += [
            "",
            f"## overflow='split' vs TRL strategy='bfd_split' ({r['examples']:,} examples, capacity "
            f"{args.split_max_length}, {r['tokens']:,} tokens in)",
            "",
            "| packer | tokens out | pieces (segments) | rows | efficiency | seconds | peak RSS (MiB) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, s in (("packing_collators overflow='split'", ours), ("TRL bfd_split", trl)):
            lines.append(
                f"| {name} | {s['tokens']:,} | {s['segments']:,} | {s['rows']:,} | {s['efficiency']:.4%} "
                f"| {s['seconds']:.1f} | {s['peak_rss_mib']:,.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default="1000000,3000000", help="sizes, comma-separated")
    parser.add_argument("--repeats", default="3,1", help="repeats per size, comma-separated (last one repeats)")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--split-max-length", type=int, default=512, help="capacity of the split comparison")
    parser.add_argument("--split-examples", type=int, default=1_000_000, help="the size the split comparison runs at")
    parser.add_argument("--num-proc", type=int, default=None, help="pack_dataset's num_proc (default: one process)")
    parser.add_argument("--workdir", default=None, help="where the data goes (default: a temporary folder)")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", default="pack_at_scale", help="results/<out>.md and .json ('' to skip)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--build", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--packer", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="bfd", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build_data(args.build, Path(args.data), seed=0)))
        return
    if args.child:
        print(json.dumps(child(args)))
        return
    print(command(), flush=True)
    sizes = [int(x) for x in args.examples.split(",")]
    repeats = [int(x) for x in args.repeats.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="pack_at_scale_"))
    results = []
    try:
        for i, n in enumerate(sizes):
            results.append(measure_size(n, repeats[min(i, len(repeats) - 1)], work, args))
            if args.out:  # after each size, so a long run leaves what it measured
                write_results(
                    args.out,
                    markdown(results, args),
                    {"command": command(), "machine": machine(), "max_length": args.max_length, "results": results},
                )
    finally:
        if not args.keep_data and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(markdown(results, args))


if __name__ == "__main__":
    main()
