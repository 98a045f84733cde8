"""The world as a data-parallel x sequence-parallel DeviceMesh: which ranks share one micro-batch.

Ranks are laid out sequence-parallel first, so a group is ``size`` consecutive ranks::

    world = 4, sequence_parallel_size = 2      mesh ("dp", "sp") = [[0, 1],
                                                                  [2, 3]]
    ranks 0, 1 train micro-batch A (rank 0 its first half, rank 1 its second); ranks 2, 3 micro-batch B

The sampler plans one micro-batch per data-parallel group (``dp_size`` replicas, this group is
``dp_rank``); the Ulysses all-to-all runs over ``sp_group``; gradients are reduced over the whole world.
Backend: NCCL on GPUs, gloo on CPUs (whatever ``torch.distributed`` was started with).
Cost: one ``init_device_mesh`` (a new process group per dimension) once, at start.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass
from typing import Any

__all__ = ["SequenceParallelMesh", "check_sequence_parallel_size", "sequence_parallel_mesh"]


def check_sequence_parallel_size(size: Any, world_size: int) -> int:
    """``size`` if it is a positive integer that divides ``world_size``, else a ValueError with the fix.

    >>> check_sequence_parallel_size(2, 4)
    2
    >>> check_sequence_parallel_size(3, 4)
    Traceback (most recent call last):
    ...
    ValueError: sequence_parallel_size=3 must divide the world size (4 processes): each group of 3 ranks trains one micro-batch. Launch a multiple of 3 processes (torchrun --nproc-per-node 3), or pass a sequence_parallel_size that divides 4 (e.g. 2).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"sequence_parallel_size must be a positive integer (1: off), got {size!r}.")
    if world_size % size:
        divisor = max(d for d in range(1, size + 1) if world_size % d == 0)
        raise ValueError(
            f"sequence_parallel_size={size} must divide the world size ({world_size} processes): each group of "
            f"{size} ranks trains one micro-batch. Launch a multiple of {size} processes (torchrun --nproc-per-node "
            f"{size}), or pass a sequence_parallel_size that divides {world_size} (e.g. {divisor})."
        )
    return size


@dataclass(frozen=True)
class SequenceParallelMesh:
    """This rank's place in the mesh.

    Attributes:
        size: ranks per sequence-parallel group (``sequence_parallel_size``); sp_rank: this rank's shard.
        dp_size: number of groups (data-parallel replicas); dp_rank: this rank's group.
        sp_group: the process group of the all-to-all (None when size is 1).
        mesh: the ``torch.distributed.DeviceMesh`` ("dp", "sp"), or None without torch.distributed.
    """

    size: int
    sp_rank: int
    dp_size: int
    dp_rank: int
    sp_group: Any = None
    mesh: Any = None


def _release_groups(groups: list) -> None:
    """At exit, the process groups the mesh made, unless the script tore the world down itself: a gloo group
    left to the interpreter's teardown can end the process with "terminate called without an active exception"."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    for group in groups:
        try:
            dist.destroy_process_group(group)
        except (ValueError, RuntimeError):  # already destroyed, or the world's own group
            pass


def sequence_parallel_mesh(size: int) -> SequenceParallelMesh:
    """The mesh for ``size`` ranks per group over the started ``torch.distributed`` world.

    Without torch.distributed (one process) only ``size=1`` is accepted.

    >>> sequence_parallel_mesh(1)
    SequenceParallelMesh(size=1, sp_rank=0, dp_size=1, dp_rank=0, sp_group=None, mesh=None)
    """
    import torch.distributed as dist

    started = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if started else 1
    check_sequence_parallel_size(size, world)
    if not started:
        return SequenceParallelMesh(size=1, sp_rank=0, dp_size=1, dp_rank=0)
    from torch.distributed.device_mesh import init_device_mesh

    backend = dist.get_backend()
    device = "cuda" if "nccl" in str(backend) else "cpu"
    mesh = init_device_mesh(device, (world // size, size), mesh_dim_names=("dp", "sp"))
    atexit.register(_release_groups, [mesh.get_group(name) for name in ("dp", "sp")])
    rank = dist.get_rank()
    return SequenceParallelMesh(
        size=size,
        sp_rank=rank % size,
        dp_size=world // size,
        dp_rank=rank // size,
        sp_group=mesh.get_group("sp") if size > 1 else None,
        mesh=mesh,
    )
