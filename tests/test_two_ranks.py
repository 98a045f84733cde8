"""The two-rank launcher of the distributed tests (``tests/_two_ranks.py``): a port taken between choosing it
and rank 0 binding it is retried on another, and a rank that fails stops the other and shows its own error."""

from __future__ import annotations

import socket

import _two_ranks
import pytest
from _two_ranks import run_two_ranks

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

WORKER = r"""
import sys
import torch
import torch.distributed as dist

if {fail!r} and int(__import__("os").environ["RANK"]) == 1:
    raise SystemExit("rank 1 gave up before the rendezvous")
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
open(sys.argv[1] + f"/rank{{dist.get_rank()}}.txt", "w").write(str(int(total)))
"""


def test_a_port_taken_before_rank_0_binds_it_is_retried_on_another(tmp_path, monkeypatch):
    # what happened under load: the free port went to another socket while rank 0 was still importing torch;
    # rank 0 then failed with EADDRINUSE and rank 1 waited for it until the timeout ("a rank hung")
    real = _two_ranks.free_port
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        monkeypatch.setattr(_two_ranks, "free_port", lambda: next(ports, None) or real())
        run_two_ranks(WORKER.replace("{fail!r}", "False"), tmp_path, timeout=60)
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == ["2", "2"]


def test_a_rank_that_fails_stops_the_other_and_its_error_is_shown(tmp_path):
    with pytest.raises(AssertionError, match="rank 1 gave up before the rendezvous"):
        run_two_ranks(WORKER.replace("{fail!r}", "True"), tmp_path, timeout=60)
