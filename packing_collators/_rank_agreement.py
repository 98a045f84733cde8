"""A set-up refused on one process of a job, refused on every process before the first step.

    each process     check()  ->  its ValueError, or none
    the job          all_gather of "passed" (the model's device: gloo or NCCL)
    a refusing one   raises its own error
    the others       raise one that names the refusing ranks (their logs say why)

Without it the others go on into the first step and wait in its collectives for a process that has stopped: gloo
then fails with "connection closed by peer", NCCL waits for its timeout. The checks are the same on every process,
so a refusal on one only is rare (hardware that differs between nodes, a batch only one rank gets), but then every
process says what happened. Cost: one small all_gather per call, where the job has several processes.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["failing_ranks", "refuse_together"]


def failing_ranks(failed: bool, device) -> list[int]:
    """The ranks of the job where ``failed`` is True (one all_gather, on ``device``); without a process group,
    this process's verdict alone (``[0]`` or ``[]``).

    >>> failing_ranks(True, "cpu"), failing_ranks(False, "cpu")
    ([0], [])
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [0] if failed else []
    flag = torch.tensor([int(failed)], device=device)
    every = [torch.zeros_like(flag) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flag)
    return [rank for rank, each in enumerate(every) if int(each.item())]


def refuse_together(check: Callable[[], None], device, who: str) -> None:
    """Run ``check`` (raises ValueError to refuse) on this process; raise on every process of the job if it
    raised on any (this process's own error, or one naming the ranks that refused).

    >>> refuse_together(lambda: None, "cpu", "PackingTrainer")  # one process: the check as it is
    """
    try:
        check()
        error = None
    except ValueError as refused:
        error = refused
    refused = failing_ranks(error is not None, device)
    if error is not None:
        raise error
    if refused:
        raise ValueError(
            f"{who}: rank {', '.join(map(str, refused))} of this job refused the set-up before the first step (its log "
            "says why); every process stops here instead of waiting for it in the first step's collectives."
        )
