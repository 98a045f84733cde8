"""Start a worker script as 2 gloo ranks on CPU (processes forked with torch imported, ``_preloaded.py``;
torch.distributed's env vars) and wait.

The worker is Python source with a ``{tests!r}`` placeholder for this folder (so it can import
``_tiny_models``); it gets the output folder as ``sys.argv[1]`` and imports the package of this
checkout (its root leads ``PYTHONPATH``, whatever copy is installed). A rank that hangs fails the
test with ``hang`` (unequal collectives hang, they do not raise); a rank that fails shows its output,
and the other is stopped then, not left waiting for it in a collective.

The port: ``free_port`` finds one free, but rank 0 binds it only once it has imported torch and the
rest (seconds, more on a loaded machine), and in between any process may take it, e.g. as the source
port of an outgoing connection. Rank 0 then fails with EADDRINUSE and rank 1 waits for it until the
timeout: the test failed as "a rank hung" now and then under load. A launch whose rank says the
address is in use is started again on another port (3 tries).

The exit: a rank that ran its script to the end leaves its process group and ends with ``os._exit(0)``
(output flushed first). Left to the interpreter's teardown, gloo's threads were now and then destroyed
while still running ("terminate called without an active exception", exit -6) after the work had passed.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from _preloaded import Started, start

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
_PORT_TAKEN = ("EADDRINUSE", "address already in use")


_EPILOGUE = """

import os as _os, sys as _sys
import torch.distributed as _dist
if _dist.is_initialized():
    _dist.destroy_process_group()
_sys.stdout.flush()
_sys.stderr.flush()
_os._exit(0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """``nproc`` ranks of ``argv`` (a script and its arguments) as gloo processes, forked with torch imported
    (``_preloaded.py``), each rank's output in ``logs/rank<r>.log`` (a file, not a pipe: no rank blocks on a
    full pipe). ``wait`` starts them again on another port when a rank found its port taken (3 tries)."""

    def __init__(self, argv: list[str], logs: Path, nproc: int = 2):
        self.argv, self.logs, self.nproc = [str(a) for a in argv], Path(logs), nproc
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs = self._start()

    def _start(self) -> list[Started]:
        port, procs = free_port(), []
        for rank in range(self.nproc):
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                   "LOCAL_RANK": str(rank), "WORLD_SIZE": str(self.nproc), "LOCAL_WORLD_SIZE": str(self.nproc)}  # fmt: skip
            procs.append(start(self.argv, log=self.logs / f"rank{rank}.log", env=env))
        return procs

    def wait(self, timeout: float) -> tuple[str, list[str]]:
        """(``"done"``, ``"failed"`` or ``"hung"`` as ``_wait`` says, each rank's output)."""
        for attempt in range(3):
            state = _wait(self.procs, timeout)
            outputs = [(self.logs / f"rank{rank}.log").read_text(errors="replace") for rank in range(self.nproc)]
            taken = any(word.lower() in output.lower() for output in outputs for word in _PORT_TAKEN)
            if not taken or attempt == 2:
                return state, outputs
            self.procs = self._start()

    def failed_output(self, outputs: list[str]) -> str:
        """The output of the rank that failed first (not one stopped here, exit -9), else rank 0's."""
        return ([o for p, o in zip(self.procs, outputs) if p.returncode not in (0, -9)] or outputs)[0]


def _wait(procs: list[Started], timeout: float) -> str:
    """Wait for every rank: ``"done"``, ``"failed"`` (once one fails the other is stopped: it would wait for
    it in a collective) or ``"hung"`` (the timeout)."""
    deadline = time.monotonic() + timeout
    while None in [p.poll() for p in procs]:  # a list: every rank polled, each time
        failed = any(p.returncode not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            return "failed" if failed else "hung"
        time.sleep(0.1)
    return "failed" if any(p.returncode for p in procs) else "done"


def run_two_ranks(worker: str, out: Path, *, hang: str = "a rank hung", timeout: float = 240) -> None:
    """Run ``worker`` (source) as ranks 0 and 1 with ``out`` as its argument; both must exit 0."""
    script = out / "worker.py"
    script.write_text(worker.format(tests=str(TESTS)) + _EPILOGUE)
    ranks = Ranks([script, out], out)
    state, outputs = ranks.wait(timeout)
    if state == "hung":
        pytest.fail(f"{hang}; the ranks' last output:\n" + "\n".join(o[-1500:] for o in outputs))
    assert state == "done", ranks.failed_output(outputs)[-3000:]
