"""Start a worker script as 2 gloo ranks on CPU (plain processes, torch.distributed's env vars) and wait.

The worker is Python source with a ``{tests!r}`` placeholder for this folder (so it can import
``_tiny_models``); it gets the output folder as ``sys.argv[1]``. A rank that hangs fails the test
with ``hang`` (unequal collectives hang, they do not raise); a rank that fails shows its output.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(worker: str, out: Path, *, hang: str = "a rank hung", timeout: float = 110) -> None:
    """Run ``worker`` (source) as ranks 0 and 1 with ``out`` as its argument; both must exit 0."""
    script = out / "worker.py"
    script.write_text(worker.format(tests=str(TESTS)))
    port, procs = free_port(), []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(script), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))  # fmt: skip
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(hang)
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-3000:]
