"""Half-written cache files: a killed build's is removed by the next build, a live build's never.

Mirrors ``offline/_partial_files.py``. The killed build is a real process, SIGKILLed while it writes.
"""

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, load_from_disk

from packing_collators import pack_dataset
from packing_collators.offline import _partial_files
from packing_collators.offline._partial_files import locked_partial, remove_dead_partials

pytestmark = pytest.mark.skipif(_partial_files.fcntl is None, reason="no fcntl (Windows): partial files are left")

REPO = Path(__file__).resolve().parents[2]

# A build that stops after handing its first chunk of rows to the writer, as if it had much more to do.
STALLED_BUILD = """
import sys, time
from datasets import load_from_disk
from packing_collators import pack_dataset
from packing_collators.offline import _disk_rows

_disk_rows.CHUNK_TOKENS_ON_DISK = 2_000  # many chunks
one_pass = _disk_rows._one_pass

def stalled(*args):
    batches = one_pass(*args)
    yield next(batches)
    print("writing", flush=True)
    time.sleep(600)

_disk_rows._one_pass = stalled
pack_dataset(load_from_disk(sys.argv[1]), 128)
"""

# A live writer: holds its partial file (and its lock) until its stdin closes.
LIVE_WRITER = """
import sys
from packing_collators.offline._partial_files import locked_partial

with locked_partial(sys.argv[1]) as partial:
    with open(partial, "wb") as handle:
        handle.write(b"rows so far")
    print(partial, flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def saved(tmp_path):
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 30_000, k).tolist() for k in rng.integers(1, 120, 2_000)]
    Dataset.from_dict({"input_ids": ids, "labels": ids}).save_to_disk(str(tmp_path / "data"), num_shards=2)
    return tmp_path / "data"


def leftovers(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if ".incomplete" in name)


def start(code: str, *args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE, text=True, **kwargs
    )


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.slow
def test_a_killed_build_leaves_a_file_that_the_next_build_removes(saved, caplog):
    build = start(STALLED_BUILD, saved)
    try:
        assert build.stdout.readline() == "writing\n"
        partial = [saved / name for name in leftovers(saved) if name.endswith(".incomplete")]
        assert len(partial) == 1
        wait_until(lambda: partial[0].stat().st_size > 0, "the first rows on disk")
    finally:
        build.send_signal(signal.SIGKILL)
        build.communicate(timeout=60)
    assert build.returncode == -signal.SIGKILL
    size = partial[0].stat().st_size
    assert leftovers(saved) == [partial[0].name, partial[0].name + ".lock"]  # left behind, as a kill leaves it

    data = load_from_disk(str(saved))
    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        packed, stats = pack_dataset(data, 128, return_stats=True)
    assert leftovers(saved) == []
    assert f"removed 1 half-written file(s) ({size / 1e9:.2f} GB) that a killed build left" in caplog.text
    tokens = sum(map(len, packed["input_ids"]))
    assert tokens == stats.packed_tokens == stats.input_tokens == sum(map(len, data["input_ids"]))
    assert packed[:] == pack_dataset(data, 128, keep_in_memory=True)[:]


@pytest.mark.slow
def test_a_live_writers_file_is_kept_and_a_dead_ones_removed(saved, caplog):
    dead = saved / "cache-0123456789abcdef.arrow.dead0000.incomplete"
    dead.write_bytes(b"x" * 1000)
    Path(f"{dead}.lock").touch()  # its writer is gone: nobody holds the lock
    writer = start(LIVE_WRITER, saved / "cache-fedcba9876543210.arrow", stdin=subprocess.PIPE)
    try:
        live = Path(writer.stdout.readline().strip())
        assert live.exists() and Path(f"{live}.lock").exists()
        assert remove_dead_partials(str(saved)) == (1, 1000)
        assert leftovers(saved) == [live.name, live.name + ".lock"]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="packing_collators"):
            pack_dataset(load_from_disk(str(saved)), 128)  # a build beside it: the live file stays
        assert leftovers(saved) == [live.name, live.name + ".lock"] and live.read_bytes() == b"rows so far"
        assert "half-written" not in caplog.text
    finally:
        writer.communicate("", timeout=60)  # the writer ends: it removes its own files
    assert writer.returncode == 0 and leftovers(saved) == []


def test_a_file_without_a_lock_is_left_and_its_path_logged(saved, caplog):
    older = saved / "cache-0123456789abcdef.arrow.old_1234.incomplete"  # an older version's: no lock file
    older.write_bytes(b"x" * 10)
    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        assert remove_dead_partials(str(saved)) == (0, 0)
    assert older.exists()
    assert "left 1 half-written file(s) (0.00 GB) with no lock, which may be another build's" in caplog.text
    assert str(older) in caplog.text


def test_without_fcntl_files_are_written_unlocked_and_left(saved, monkeypatch, caplog):
    dead = saved / "cache-0123456789abcdef.arrow.dead0000.incomplete"
    dead.write_bytes(b"x")
    Path(f"{dead}.lock").touch()
    monkeypatch.setattr(_partial_files, "fcntl", None)
    with locked_partial(str(saved / "out.arrow")) as partial:
        assert partial.endswith(".incomplete") and not os.path.exists(partial + ".lock")
    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        packed = pack_dataset(load_from_disk(str(saved)), 128)
    assert len(packed) and dead.exists()
    assert "with no lock, without fcntl, which may be another build's" in caplog.text


def test_a_finished_build_leaves_no_partial_or_lock_file(saved):
    pack_dataset(load_from_disk(str(saved)), 128, num_proc=2)
    pack_dataset(load_from_disk(str(saved)), 128, strategy="wrapped")
    assert leftovers(saved) == []
