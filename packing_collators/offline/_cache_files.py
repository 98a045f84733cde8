"""pack_dataset's result on disk: Arrow cache files named by fingerprint, like ``Dataset.map``'s, and reused.

Beside the source's own cache files (or at ``cache_file_name``)::

    data-00000-of-00005.arrow ...                 the source (load_from_disk, map, ...)
    cache-3f2c...e1.arrow                         the packed rows (memory-mapped when loaded)
    cache-3f2c...e1_00000_of_00002.arrow ...      or one file per process, with num_proc=2
    cache-3f2c...e1.json                          the statistics and the files: written last

The fingerprint hashes the source's fingerprint, every option that decides the rows
(``PackOptions.output_key``: not ``num_proc`` nor ``progress``) and the library's version, so a second identical call
finds the JSON and loads the files (under a second at any size) instead of packing again.
The JSON records the fingerprint too, and a build removes it first: a ``cache_file_name``
written with other options or input, or a build stopped halfway, is packed again, never loaded.
Each file is written as ``<name>.<random>.incomplete``, locked by its writer, then renamed; a
build first removes those of the folder whose writer died (``_partial_files``).
Building: the dataset's Arrow files are read directly (``_arrow_files``) and each row written
once (``_disk_rows``; in two passes through temp files when the input is larger than memory),
in memory bounded by a chunk plus O(examples); a dataset that is not
its files as they are (an indices mapping, rows in memory, a cast replayed) is read in memory
(logged at INFO) and its rows still written chunk by chunk. With ``num_proc``, processes write
contiguous row ranges of the one plan, as files that form one dataset in order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import fields

import pyarrow as pa

from .._compat import cache_file_path, dataset_fingerprint, set_dataset_fingerprint
from ..engine import PackStats
from ._arrow_files import ArrowFiles, dataset_arrow_files
from ._arrow_rows import TableTokens, row_batches
from ._columns import ExampleColumns, example_columns, read_examples
from ._disk_rows import write_batches, write_rows
from ._options import PackOptions
from ._partial_files import remove_dead_partials
from ._planning import plan_rows
from ._row_plan import RowPlan, shard_bounds

__all__ = ["pack_to_cache", "packed_fingerprint"]

logger = logging.getLogger(__name__)


def packed_fingerprint(dataset, options: PackOptions) -> str:
    """Derived from the input's fingerprint, the options that decide the rows and this library's version.

    Hashing the rows would take seconds; the version stands for the packing code, which a release may change.
    """
    from datasets.fingerprint import Hasher, generate_random_fingerprint

    from .._version import __version__

    source = dataset_fingerprint(dataset)
    key = ["pack_dataset", __version__, source, options.output_key()]
    return Hasher.hash(key) if source else generate_random_fingerprint()


def _stats_path(path: str) -> str:
    root, ext = os.path.splitext(path)
    return (root if ext == ".arrow" else path) + ".json"


def _load(stats_path: str, fingerprint: str, split=None):
    """``(dataset, stats)`` from a finished cache of these very rows (same fingerprint), or None when there is none."""
    from datasets import Dataset, concatenate_datasets

    try:
        with open(stats_path) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    if record.get("fingerprint") != fingerprint:  # a cache_file_name written with other options or input
        return None
    directory = os.path.dirname(os.path.abspath(stats_path))
    paths = [os.path.join(directory, name) for name in record.get("files", [])]
    if not paths or not all(map(os.path.exists, paths)):
        return None
    parts = [Dataset.from_file(path, split=split) for path in paths]
    packed = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    set_dataset_fingerprint(packed, fingerprint)
    return packed, PackStats(**record["stats"])


def _write_shard(paths, file_column, columns: ExampleColumns, plan: RowPlan, label_pad_id: int, out: str) -> None:
    """One process's rows (``num_proc``): the files opened again (no checks: the parent ran them)."""
    write_rows(ArrowFiles(paths, file_column, columns, check=False), plan, columns, out, label_pad_id=label_pad_id)


def _write_in_processes(source, plan: RowPlan, columns, options: PackOptions, path: str, progress: bool) -> list[str]:
    from tqdm.auto import tqdm

    root = os.path.splitext(path)[0]
    count = options.num_proc
    outs = [f"{root}_{i:05d}_of_{count:05d}.arrow" for i in range(count)]
    parts = [plan.rows(*shard_bounds(plan.num_rows, count, i)) for i in range(count)]
    jobs = [
        (source.paths, source.file_column, columns, part, options.label_pad_id, out) for part, out in zip(parts, outs)
    ]
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"  # as datasets' map
    try:
        # not multiprocessing.Pool: it waits forever for the task of a process that was killed
        with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context(method)) as pool:
            results = [pool.submit(_write_shard, *job) for job in jobs]
            for result in tqdm(results, desc="Packing rows", unit="shard", disable=not progress):
                result.result()
    except BaseException as error:
        for out in outs:  # the files of the processes that finished: no statistics will list them
            with contextlib.suppress(OSError):
                os.remove(out)
        if isinstance(error, BrokenProcessPool):
            raise RuntimeError(
                f"A num_proc={count} process writing the packed rows died (killed, e.g. out of memory). "
                "Pass a smaller num_proc (each process holds one chunk of rows), or none."
            ) from error
        raise
    return outs


def _read_in_memory(dataset, columns: ExampleColumns):
    table = dataset.with_format("arrow")[:] if len(dataset) else dataset.data.table.slice(0, 0)
    _, lengths = read_examples(table, columns)
    return table, lengths


def _write(dataset, options: PackOptions, path: str, progress, desc: str) -> tuple[list[str], PackStats]:
    """Pack ``dataset`` into the file at ``path`` (or one file per process); the files and the statistics."""
    columns = example_columns(dataset.data.schema, options.keep_columns)
    schema = dataset.data.schema
    booleans = [name for name in columns.tokens if pa.types.is_boolean(schema.field(name).type.value_type)]
    files = f"its column(s) {booleans} hold bits, not bytes" if booleans else dataset_arrow_files(dataset)
    if isinstance(files, str):
        logger.info("pack_dataset: reading the dataset in memory, since %s", files)
        table, lengths = _read_in_memory(dataset, columns)
        plan, stats = plan_rows(lengths, options)
        source = TableTokens(table, columns, lengths)
        write_batches(row_batches(source, plan, columns, label_pad_id=options.label_pad_id), path)
        return [path], stats
    source = ArrowFiles(*files, columns)
    plan, stats = plan_rows(source.lengths, options)
    show = progress(int(plan.length.sum()))  # not plan.total_tokens: it caches 8 bytes per segment
    if options.num_proc and options.num_proc > 1 and plan.num_rows >= options.num_proc:
        return _write_in_processes(source, plan, columns, options, path, show), stats
    write_rows(source, plan, columns, path, label_pad_id=options.label_pad_id, progress=show, desc=desc)
    return [path], stats


def pack_to_cache(dataset, options: PackOptions, *, path: str | None, load_from_cache_file: bool, progress, desc: str):
    """``(packed, stats, from_cache)``: ``dataset`` packed into Arrow files (at ``path``, else beside its own)."""
    fingerprint = packed_fingerprint(dataset, options)
    path = path or cache_file_path(dataset, fingerprint)
    stats_path = _stats_path(path)
    if load_from_cache_file and (cached := _load(stats_path, fingerprint, dataset.split)):
        logger.info("pack_dataset: loading the packed rows from %s", stats_path)
        return (*cached, True)
    # first: a build stopped halfway must not leave old stats listing its new rows
    with contextlib.suppress(FileNotFoundError):
        os.remove(stats_path)
    remove_dead_partials(os.path.dirname(os.path.abspath(path)))  # what killed builds left (never a live one's)
    outs, stats = _write(dataset, options, path, progress, desc)
    record = {
        "fingerprint": fingerprint,
        "files": [os.path.basename(out) for out in outs],
        "stats": {f.name: getattr(stats, f.name) for f in fields(stats)},
    }
    with open(stats_path + ".incomplete", "w") as handle:
        json.dump(record, handle, indent=1)
    os.replace(stats_path + ".incomplete", stats_path)  # last: a cache without it is not used
    packed, stats = _load(stats_path, fingerprint, dataset.split)
    return packed, stats, False
