"""bench_offline.py's data and the jobs it runs in fresh processes (``bench_offline.py --child``, so each
one's peak memory is its own): building the at-scale data, packing it, packing a stream. numpy only at import."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import lengths_of, peak_rss_mib  # noqa: E402

BLOCK = 10_000  # the streaming generator draws its lengths in blocks of this many examples


# ----------------------------------------------------------------------------- data
def token_column(dist: str, n: int, seed: int):
    """A pyarrow list column of ``n`` examples' int32 tokens, its offsets and its token count."""
    import pyarrow as pa

    lengths = lengths_of(dist, n, seed)
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    tokens = np.random.default_rng(seed + 1).integers(0, 32000, int(lengths.sum()), dtype=np.int32)
    return pa.ListArray.from_arrays(offsets, pa.array(tokens)), offsets, int(lengths.sum())


def stream_lengths(n: int, job: dict) -> list[np.ndarray]:
    """The lengths the streaming generator yields, block by block."""
    return [
        lengths_of(job["dist"], min(BLOCK, n - s), job["seed"] + s, high=job["max_length"]) for s in range(0, n, BLOCK)
    ]


def stream_examples(n: int, job: dict):
    """``n`` examples ``{"input_ids": int32 array}``, lengths from ``job["dist"]`` clipped to max_length."""
    rng = np.random.default_rng(job["seed"])
    for lengths in stream_lengths(n, job):
        tokens = rng.integers(0, 32000, int(lengths.sum()), dtype=np.int32)
        yield from ({"input_ids": ids} for ids in np.split(tokens, np.cumsum(lengths)[:-1]))


def build_data(job: dict) -> dict:
    """``n`` sft examples in save_to_disk's layout (in a child: its memory is not the packers')."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    n, folder = job["n"], Path(job["data"])
    column, _, tokens = token_column("sft", n, 0)
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
    state.update(_data_files=[{"filename": name} for name in names], _fingerprint=f"sft-{n}-0")
    (folder / "state.json").write_text(json.dumps(state))
    return {"examples": n, "tokens": tokens, "bytes_on_disk": sum(f.stat().st_size for f in folder.glob("*.arrow"))}


def count_of(packed, column: str) -> int:
    """The number of values in a packed dataset's list column (tokens of input_ids, segments of seq_lengths)."""
    import pyarrow.compute as pc

    return int(pc.sum(pc.list_value_length(packed.data.table.column(column))).as_py())


# ----------------------------------------------------------------------------- fresh-process children
def child_stream(job: dict) -> dict:
    """Pack (or, for "source", only read) an n-example generator."""
    n, strategy, start, stats = job["n"], job["strategy"], time.perf_counter(), None
    if strategy == "source":
        rows, tokens = 0, sum(len(example["input_ids"]) for example in stream_examples(n, job))
    else:
        from packing_collators import pack_dataset

        packed, stats = pack_dataset(
            stream_examples(n, job),
            job["max_length"],
            strategy=strategy,
            buffer_size=job["buffer_size"],
            return_stats=True,
        )
        rows = tokens = 0
        for row in packed:
            rows, tokens = rows + 1, tokens + len(row["input_ids"])
        assert rows == stats.rows and tokens == stats.packed_tokens == stats.input_tokens, (rows, tokens, stats)
    return {
        "strategy": strategy,
        "examples": n,
        "buffer_size": job["buffer_size"],
        "rows": rows,
        "tokens": tokens,
        "seconds": time.perf_counter() - start,
        "peak_rss_mib": peak_rss_mib(),
        **{
            k: getattr(stats, k, None)
            for k in ("lower_bound_rows", "efficiency", "rows_over_lower_bound", "split_examples")
        },
    }


def rss_anon_mib(pid: int | str = "self") -> float | None:
    """A process's anonymous resident memory now (``RssAnon``: not its mapped files), or None without /proc."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def child_pack(job: dict) -> dict:
    """One at-scale packing in this (fresh) process: load_from_disk, then the packer; what it took.

    The packer is imported before the clock starts (TRL imports torch: seconds, and a fifth of its
    anonymous memory); ``anon_before_mib`` is this process's anonymous memory just before the call.
    """
    import logging
    import resource

    import datasets

    datasets.disable_progress_bars()
    start = time.perf_counter()
    if job["packer"] == "trl":
        from trl import pack_dataset as trl_pack
    else:
        from packing_collators import pack_dataset
    import_seconds = time.perf_counter() - start
    messages: list[str] = []  # which path pack_dataset took (one pass, or two through temp files)
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("packing_collators.offline._disk_rows").addHandler(handler)
    logging.getLogger("packing_collators.offline._disk_rows").setLevel(logging.INFO)
    dataset = datasets.load_from_disk(job["data"])
    anon_before = rss_anon_mib()
    start = time.perf_counter()
    if job["packer"] == "trl":
        packed = trl_pack(
            dataset, job["max_length"], strategy=job["strategy"], map_kwargs={"load_from_cache_file": False}
        )
    else:
        overflow = "split" if job["strategy"] == "bfd_split" else "error"
        packed = pack_dataset(dataset, job["max_length"], overflow=overflow, num_proc=job["num_proc"])
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens, segments = count_of(packed, "input_ids"), count_of(packed, "seq_lengths")
    return {
        "seconds": seconds,
        "import_seconds": import_seconds,
        "peak_rss_mib": peak,
        "anon_before_mib": anon_before,
        "rows": len(packed),
        "tokens": tokens,
        "segments": segments,
        "efficiency": tokens / (len(packed) * job["max_length"]),
        "cache_files": len(packed.cache_files),
        "log": messages,
    }


CHILDREN = {"stream": child_stream, "pack": child_pack, "build": build_data}
