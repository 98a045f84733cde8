"""Packed rows written to an Arrow stream file once, in bounded memory, from the dataset's own files.

The rows come out shuffled, so one output chunk's tokens are scattered over the whole input.
When the input's token columns fit in the available memory (``MEMORY_SHARE`` of ``MemAvailable``,
so they stay in the page cache), each chunk is gathered straight from the input's memory map::

    one pass   for each chunk of rows: each segment copied from the input's map straight to
               its place in row order (one memcpy), into reused buffers, written
                   input   [e0 e1 e2 e3 | e4 e5 e6 e7 | ...]     mapped, pages kept until the end
                   out     [chunk 0 rows | chunk 1 rows | ...]   each row written once

Otherwise (a dataset larger than memory, or no ``/proc/meminfo``) reading the input chunk
after chunk would read it from disk once per chunk, so it is read once, in order, through temp files::

    pass 1 (scatter)  read the input window by window, in file order; each segment's tokens
                      go to a temporary file, chunk after chunk, in input order within a chunk
                          temp    [chunk 0: e1 e4 e6 ... | chunk 1: e0 e3 e7 ... | ...]
    pass 2 (gather)   read one chunk's region of the temp file, put its segments in row order,
                      write its rows (one record batch) to the output file

Memory (anonymous): three chunks of rows (``CHUNK_TOKENS_ON_DISK``, 2M tokens: two being built
in threads, one being written; the one pass reuses their buffers), plus the plan (O(segments));
what planning freed is given back (:func:`release_freed_memory`).
The one pass also maps the input's pages (file-backed and clean: they count in the RSS, not in
the anonymous memory, and the kernel can drop them); the two passes read one window at a time,
released after use. Disk: the one pass writes each row once; the two passes also write (and
read back) one temp file per token column, deleted at the end. Measured against TRL:
``benchmarks/results/pack_at_scale_3m.md``. A writer thread lets the kernel copy one chunk out
while the next ones are built. No Python loop over tokens; the one pass makes a numpy view per
segment for ``np.concatenate`` (about 0.3 us each), the two passes none.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from ._arrow_files import ArrowFiles
from ._arrow_rows import chunk_bounds, gather_runs, rows_batch
from ._columns import ExampleColumns
from ._partial_files import locked_partial
from ._row_plan import RowPlan

__all__ = ["MEMORY_SHARE", "release_freed_memory", "scatter_positions", "write_batches", "write_rows"]

logger = logging.getLogger(__name__)

MEMORY_SHARE = 0.5
"""One pass when the input's token bytes are at most this share of the available memory (they stay in the page cache)."""

CHUNK_TOKENS_ON_DISK = 1 << 21
"""Tokens per chunk of rows written to a file (one record batch); about three chunks are in memory at once."""

BUILDERS = 2
"""Threads building chunks in the one pass (numpy and Arrow release the GIL; a third thread writes)."""


def scatter_positions(plan: RowPlan, bounds: list[tuple[int, int]], num_examples: int) -> np.ndarray:
    """int64 (s,) where each segment's first token goes in the temp file: chunk after chunk, by example within one.

    >>> from packing_collators import pack_lengths
    >>> from packing_collators.offline._row_plan import bin_plan
    >>> plan = bin_plan(pack_lengths([5, 2, 4, 1, 3], capacity=8), row_order=np.array([1, 0]))
    >>> plan.example.tolist(), scatter_positions(plan, [(0, 1), (1, 2)], 5).tolist()
    ([1, 2, 3, 0, 4], [0, 2, 6, 7, 12])
    """
    edges = plan.row_offsets[[first for first, _ in bounds] + [bounds[-1][1]]]
    chunk = np.repeat(np.arange(len(bounds), dtype=np.int64), np.diff(edges))
    by_chunk_then_example = np.argsort(chunk * (num_examples + 1) + plan.example, kind="stable")
    positions = np.empty(len(plan.example), np.int64)
    lengths = plan.length[by_chunk_then_example]
    positions[by_chunk_then_example] = np.cumsum(lengths) - lengths
    return positions


class _Buffers:
    """Read buffers reused from chunk to chunk: a fresh 64 MB array costs more in page faults than the work in it."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, key: str, size: int, dtype) -> np.ndarray:
        array = self._arrays.get(key)
        if array is None or array.dtype != np.dtype(dtype) or len(array) < size:
            array = self._arrays[key] = np.empty(size, dtype)
        return array[:size]


def _pwrite_all(file, data: np.ndarray, offset: int) -> None:
    """``data`` into ``file`` at byte ``offset`` (a seek and a write where there is no ``os.pwrite``: Windows)."""
    view = memoryview(data).cast("B")
    if not hasattr(os, "pwrite"):
        file.seek(offset)
        file.write(view)
        return
    while len(view):
        written = os.pwrite(file.fileno(), view, offset)
        view, offset = view[written:], offset + written


def _pread_all(file, out: np.ndarray, offset: int) -> np.ndarray:
    """``out`` filled from ``file`` at byte ``offset`` (a seek and a read where there is no ``os.preadv``)."""
    view = memoryview(out).cast("B")
    if not hasattr(os, "preadv"):
        file.seek(offset)
        read = file.readinto(view)
        assert read == len(view), "the temp file is shorter than its chunks"
        return out
    while len(view):
        read = os.preadv(file.fileno(), [view], offset)
        assert read, "the temp file is shorter than its chunks"
        view, offset = view[read:], offset + read
    return out


class _Writer:
    """One write at a time in a background thread, so the kernel copies a chunk while numpy builds the next."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool, self.pending = pool, None

    def submit(self, fn, *args) -> None:
        self.wait()
        self.pending = self.pool.submit(fn, *args)

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None


def _pwrite_runs(temps: dict, data: dict, runs: list, token_starts: np.ndarray, dest: np.ndarray) -> None:
    for name, temp in temps.items():
        for r0, r1 in runs:
            values = data[name]
            _pwrite_all(temp, values[token_starts[r0] : token_starts[r1]], int(dest[r0]) * values.itemsize)


def _scatter(files: ArrowFiles, plan: RowPlan, positions: np.ndarray, temps: dict, writer: _Writer, bar) -> None:
    """Pass 1: every segment's tokens into the temp files, window by window of the input."""
    by_example = np.argsort(plan.example, kind="stable")
    sorted_examples = plan.example[by_example]
    for window in files.windows:
        lo, hi = np.searchsorted(sorted_examples, [window.first, window.last])
        segments = by_example[lo:hi]
        if not len(segments):  # a shard or a process may have none of this window's examples
            continue
        segments = segments[np.argsort(positions[segments], kind="stable")]
        lengths, dest = plan.length[segments], positions[segments]
        breaks = np.flatnonzero(dest[1:] != dest[:-1] + lengths[:-1]) + 1  # runs contiguous in the temp file
        runs = list(zip(np.r_[0, breaks].tolist(), np.r_[breaks, len(segments)].tolist()))
        token_starts = np.r_[0, np.cumsum(lengths)]
        data = {}
        for name in temps:
            starts = files.starts(name, plan.example[segments]) + plan.skip[segments]
            data[name] = gather_runs(files.view(window.file, name), starts, lengths)  # fresh arrays: no reuse
        files.release(window.file)
        writer.submit(_pwrite_runs, temps, data, runs, token_starts, dest)
        bar.update(int(token_starts[-1]))
    writer.wait()


def _gather(files, plan, positions, temps, columns, label_pad_id, buffers, bar) -> Iterator[pa.RecordBatch]:
    """Pass 2: each chunk's rows, its tokens read back from the temp files."""
    for chunk_index, (first, last) in enumerate(chunk_bounds(plan, CHUNK_TOKENS_ON_DISK)):
        part = plan.rows(first, last)
        s0, s1, base = int(plan.row_offsets[first]), int(plan.row_offsets[last]), int(plan.row_starts[first])
        starts = positions[s0:s1] - base
        tokens = {}
        for name, temp in temps.items():
            dtype = files.dtype(name)
            chunk = _pread_all(temp, buffers.get(name, part.total_tokens, dtype), base * dtype.itemsize)
            tokens[name] = gather_runs(chunk, starts, part.length)  # fresh: the buffer is read into again
        kept = {name: files.take(name, part.example) for name in columns.keep}
        if columns.keep:
            files.release()
        # two buffers in turn: the previous chunk's may still be being written
        positions_out = buffers.get(f"position_ids/{chunk_index % 2}", part.total_tokens, np.int32)
        yield rows_batch(part, tokens, columns, label_pad_id, kept, positions_out=positions_out)
        bar.update(part.total_tokens)


def write_batches(batches: Iterable[pa.RecordBatch], path: str, writer: _Writer | None = None) -> None:
    """Record batches into an Arrow stream file at ``path`` (written beside it, then renamed: never half a file).

    With ``writer``, each batch is written in its thread while the next one is built. The partial
    file is locked while it is written (``_partial_files``), so a later build removes it only if
    this process dies before renaming it.
    """
    with locked_partial(path) as partial:
        stream = None
        with pa.OSFile(partial, "wb") as sink:
            for batch in batches:
                stream = stream or pa.ipc.new_stream(sink, batch.schema)
                if writer is None:
                    stream.write_batch(batch)
                else:
                    writer.submit(stream.write_batch, batch)
            if writer is not None:
                writer.wait()
            stream.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(partial, 0o666 & ~umask)  # as Dataset.map leaves its cache files (it was made 0o600)
        os.replace(partial, path)


def _copy_runs(views: list[np.ndarray], file_of, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray):
    """``views[file_of[i]][starts[i] : starts[i] + lengths[i]]`` end to end, into ``out`` (its length: their total).

    One memcpy per run into a buffer that is reused, where a gather into fresh memory would fault
    its pages in again for every chunk.
    """
    ends = (starts + lengths).tolist()
    pieces = [views[f][s:e] for f, s, e in zip(file_of.tolist(), starts.tolist(), ends)]
    return np.concatenate(pieces, out=out) if pieces else out


def _chunk_rows(
    files: ArrowFiles, plan: RowPlan, columns: ExampleColumns, label_pad_id: int, buffers: _Buffers
) -> pa.RecordBatch:
    """One chunk's rows, each segment copied from the input's memory map straight to its place in ``buffers``."""
    file_of = np.searchsorted(files.file_first, plan.example, side="right") - 1
    tokens = {}
    for name in columns.tokens:
        views = [files.view(f, name) for f in range(len(files.paths))]
        starts = files.starts(name, plan.example) + plan.skip
        out = buffers.get(name, plan.total_tokens, files.dtype(name))
        tokens[name] = _copy_runs(views, file_of, starts, plan.length, out)
    kept = {name: files.take(name, plan.example) for name in columns.keep}
    positions_out = buffers.get("position_ids", plan.total_tokens, np.int32)
    return rows_batch(plan, tokens, columns, label_pad_id, kept, positions_out=positions_out)


def _one_pass(files, plan, columns, label_pad_id, pool: ThreadPoolExecutor, bar) -> Iterator[pa.RecordBatch]:
    """Each chunk's rows, built in ``pool`` one chunk ahead of the one yielded, in order.

    A chunk's columns live in one of ``BUILDERS + 1`` sets of buffers, reused: a set is free again
    once its chunk is written, which it is when the consumer asks for the chunk after it
    (:func:`write_batches` hands each batch to its writer after the previous one is written).
    """
    free = collections.deque(_Buffers() for _ in range(BUILDERS + 1))
    pending: collections.deque = collections.deque()
    written = None  # the buffers of the chunk given to the writer last
    bounds = chunk_bounds(plan, CHUNK_TOKENS_ON_DISK)
    for index, (first, last) in enumerate(bounds):
        part = plan.rows(first, last)
        buffers = free.popleft()
        future = pool.submit(_chunk_rows, files, part, columns, label_pad_id, buffers)
        pending.append((future, buffers, part.total_tokens))
        while pending and (len(pending) > 1 or index == len(bounds) - 1):
            future, buffers, tokens = pending.popleft()
            yield future.result()
            if written is not None:  # asked for the next chunk: the one before this is written
                free.append(written)
            written = buffers
            bar.update(2 * tokens)
    files.release()


def _available_memory() -> int:
    """Bytes of memory the system could give (``MemAvailable``: free plus reclaimable page cache); 0 if unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def release_freed_memory() -> None:
    """Give freed heap pages back to the system: Arrow's pool's, and glibc's (``malloc_trim``).

    glibc keeps freed blocks smaller than its mmap threshold in the heap, and that threshold rises
    to the largest block freed so far (up to 32 MB), so the planner's O(examples) temporaries stay
    resident after planning (140 MB of 316 MB anonymous memory for 3M examples). Without glibc
    (musl, macOS, Windows) only Arrow's pool is asked.
    """
    pa.default_memory_pool().release_unused()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):  # no glibc; Windows has no CDLL(None)
        return
    trim(0)


def write_rows(
    files: ArrowFiles,
    plan: RowPlan,
    columns: ExampleColumns,
    path: str,
    *,
    label_pad_id: int = -100,
    progress: bool = False,
    desc: str = "Packing rows",
) -> None:
    """The rows of ``plan`` over ``files``, written to ``path`` once (or in two passes: see the module docstring)."""
    from tqdm.auto import tqdm

    total_tokens = int(plan.length.sum())  # plan.total_tokens caches 8 bytes per segment (a chunk's: few)
    token_bytes = total_tokens * sum(files.dtype(name).itemsize for name in columns.tokens)
    release_freed_memory()  # what planning freed
    with contextlib.ExitStack() as stack:
        stack.callback(release_freed_memory)  # the chunks' buffers
        bar = stack.enter_context(
            tqdm(total=2 * total_tokens, desc=desc, unit="tok", unit_scale=True, disable=not progress)
        )
        writer = _Writer(stack.enter_context(ThreadPoolExecutor(max_workers=1)))
        available = _available_memory()
        one_pass = token_bytes <= MEMORY_SHARE * available
        logger.info(
            "pack_dataset: writing %d rows (%.2f GB of tokens, %.2f GB available) %s",
            plan.num_rows, token_bytes / 1e9, available / 1e9,
            "in one pass from the mapped input" if one_pass else "in two passes through temp files",
        )  # fmt: skip
        if one_pass:
            builders = stack.enter_context(ThreadPoolExecutor(max_workers=BUILDERS))
            write_batches(_one_pass(files, plan, columns, label_pad_id, builders, bar), path, writer)
            return
        bounds = chunk_bounds(plan, CHUNK_TOKENS_ON_DISK)
        positions = scatter_positions(plan, bounds, int(files.file_first[-1]))
        directory = os.path.dirname(os.path.abspath(path))
        temps = {name: stack.enter_context(tempfile.TemporaryFile(dir=directory)) for name in columns.tokens}
        _scatter(files, plan, positions, temps, writer, bar)
        batches = _gather(files, plan, positions, temps, columns, label_pad_id, _Buffers(), bar)
        write_batches(batches, path, writer)
