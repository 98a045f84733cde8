"""Half-written cache files: each one locked by its writer, and removed once that writer is dead.

A build writes its rows to ``<name>.<random>.incomplete`` beside the final file and renames it at
the end; a build that is killed (SIGKILL, out of memory) leaves it behind, as large as what it had
written. Its writer holds an exclusive ``flock`` on a lock file beside it, taken *before* the
partial file exists, and the kernel releases that lock when the writer dies, however it dies::

    cache-3f2c...e1.arrow.k2j4x9a0.incomplete.lock    created and locked first; removed last
    cache-3f2c...e1.arrow.k2j4x9a0.incomplete         the rows so far; renamed to cache-3f2c...e1.arrow

Before writing, a build tries a non-blocking lock on each lock file in its folder: one it can take
belongs to a dead writer, so that writer's partial file is removed (then the lock file), and the
count and bytes are logged. A live build's lock cannot be taken, so its file is never touched
(another shard's job writing into the same folder, say). A partial file without a lock file was
written by an older version or without locks (no ``fcntl``: Windows; a filesystem that refuses
locks): nothing can tell whether its writer is alive, so it is left and its path logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

__all__ = ["PARTIAL_SUFFIX", "locked_partial", "remove_dead_partials"]

logger = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".incomplete"
_LOCK_SUFFIX = PARTIAL_SUFFIX + ".lock"
_OURS = re.compile(r".+\.[a-z0-9_]{8}" + re.escape(PARTIAL_SUFFIX))  # mkstemp's 8 random characters


def _try_lock(handle: int) -> bool:
    """Whether this process now holds the exclusive lock (False: someone holds it, or locks fail here)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held by a live writer; others: no locks on this filesystem
        return False
    return True


@contextlib.contextmanager
def locked_partial(path: str) -> Iterator[str]:
    """A fresh ``<path>.<random>.incomplete`` to write into, locked as long as this ``with`` lasts.

    On leaving, the partial file is removed if it is still there (the caller renames it to ``path``
    on success), then its lock file. Without ``fcntl``, or where the lock is refused, the file has
    no lock file, as an older version's.
    """
    directory, name = os.path.split(os.path.abspath(path))
    lock, partial = None, None
    try:
        if fcntl is not None:
            handle, lock_path = tempfile.mkstemp(dir=directory, prefix=name + ".", suffix=_LOCK_SUFFIX)
            lock = (handle, lock_path)
            if _try_lock(handle):  # locked before the partial file exists: no one sees it unlocked
                partial = lock_path[: -len(".lock")]
                os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            else:  # no locks on this filesystem (or, against all odds, a scan took it first): write unlocked
                lock = None
                os.close(handle)
                with contextlib.suppress(OSError):
                    os.remove(lock_path)
        if partial is None:
            handle, partial = tempfile.mkstemp(dir=directory, prefix=name + ".", suffix=PARTIAL_SUFFIX)
            os.close(handle)
        yield partial
    finally:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.remove(partial)
        if lock is not None:  # last, while still locked: the partial file is gone by now
            with contextlib.suppress(OSError):
                os.remove(lock[1])
            os.close(lock[0])


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def remove_dead_partials(directory: str) -> tuple[int, int]:
    """Remove the partial files in ``directory`` whose writer is dead; ``(files, bytes)`` removed.

    Never one whose writer still holds its lock. Partial files with no lock file are left, and logged.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return 0, 0
    locks = {name for name in names if name.endswith(_LOCK_SUFFIX)}
    unlocked = [  # without fcntl no lock can be tried: every partial file is of unknown state
        os.path.join(directory, name)
        for name in names
        if _OURS.fullmatch(name) and (fcntl is None or name + ".lock" not in locks)
    ]
    removed, freed = 0, 0
    if fcntl is not None:
        for lock_name in sorted(locks):
            lock_path = os.path.join(directory, lock_name)
            try:
                handle = os.open(lock_path, os.O_RDWR)
            except OSError:  # gone: its writer finished (or another build removed it) meanwhile
                continue
            try:
                if not _try_lock(handle):
                    continue
                partial = lock_path[: -len(".lock")]  # first the partial file, then its lock file
                size = _size(partial)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(partial)
                    removed, freed = removed + 1, freed + size
                with contextlib.suppress(FileNotFoundError):
                    os.remove(lock_path)
            finally:
                os.close(handle)
    if removed:
        logger.warning(
            "pack_dataset: removed %d half-written file(s) (%.2f GB) that a killed build left in %s",
            removed, freed / 1e9, directory,
        )  # fmt: skip
    if unlocked:
        why = "without fcntl, " if fcntl is None else ""
        logger.warning(
            "pack_dataset: left %d half-written file(s) (%.2f GB) with no lock, %swhich may be another build's "
            "still being written (or written by an older version): %s. Delete them once no pack_dataset is "
            "writing into %s.",
            len(unlocked), sum(map(_size, unlocked)) / 1e9, why, ", ".join(sorted(unlocked)), directory,
        )  # fmt: skip
    return removed, freed
