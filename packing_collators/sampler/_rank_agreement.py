"""Every rank must build the sampler from the same inputs: one exchange at construction checks it.

Each rank plans the epoch for all ranks on its own, without talking to the others, so the
ranks agree on the number of steps only if they pass the same lengths and settings. A rank
given another dataset (a per-rank shard, another filter) plans another number of steps:
training hangs at the first step one rank lacks, or dies with a gloo/NCCL error that names
nothing. So when the sampler's ranks are the process group's, the ranks swap a fingerprint
of what decides the plan::

    rank 0  {"examples": 1200, "tokens": 177295, "lengths_hash": "229e04b3e420ef0f", "seed": 0, ...}
    rank 1  {"examples": 1000, "tokens": 147117, "lengths_hash": "f021c164ca06bf7f", "seed": 0, ...}

and every rank raises the same ``ValueError``, naming the ranks that differ from rank 0.

Cost: one ``all_gather_object`` of about 200 bytes per rank, at construction only (not per
epoch or step), plus one blake2b pass over the lengths.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch.distributed as dist

__all__ = ["check_ranks_agree", "fingerprint", "mismatch_message"]

_DATASET_KEYS = ("examples", "tokens", "lengths_hash")


def fingerprint(lengths: np.ndarray, **settings) -> dict:
    """What decides the epoch's plan, in a few numbers: equal on two ranks means the same plan.

    >>> fingerprint(np.array([3, 5, 2]), seed=0)
    {'examples': 3, 'tokens': 10, 'lengths_hash': 'cc78e5e7474f201b', 'seed': 0}
    """
    data = np.ascontiguousarray(lengths, dtype="<i8").tobytes()
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    return {"examples": int(len(lengths)), "tokens": int(np.sum(lengths)), "lengths_hash": digest, **settings}


def _differences(rank: int, mine: dict, first: dict) -> tuple[list[str], list[str]]:
    """How ``rank``'s fingerprint differs from rank 0's, in words, and what differs
    (``"dataset"`` and the names of the settings)."""
    found, what = [], []
    if (mine["examples"], mine["tokens"]) != (first["examples"], first["tokens"]):
        found.append(
            f"rank {rank} has {mine['examples']:,} examples ({mine['tokens']:,} tokens), "
            f"rank 0 has {first['examples']:,} ({first['tokens']:,} tokens)"
        )
    elif mine["lengths_hash"] != first["lengths_hash"]:
        found.append(
            f"rank {rank} has the same {mine['examples']:,} examples and {mine['tokens']:,} tokens as rank 0 "
            "but different lengths or order"
        )
    what += ["dataset"] if found else []
    for key in first:
        if key not in _DATASET_KEYS and mine.get(key) != first[key]:
            found.append(f"rank {rank} has {key}={mine.get(key)!r}, rank 0 has {key}={first[key]!r}")
            what.append(key)
    return found, what


def _fixes(what: list[str]) -> list[str]:
    fixes = []
    if "dataset" in what:
        fixes.append(
            "every rank must build the sampler from the same dataset (loaded, filtered and ordered the same "
            "way, and all of it: the sampler deals the batches to the ranks, so do not shard the dataset by rank)"
        )
    settings = [key for key in dict.fromkeys(what) if key != "dataset"]
    if settings:
        names = " and ".join([", ".join(settings[:-1]), settings[-1]] if len(settings) > 1 else settings)
        fixes.append(f"pass the same {names} on every rank")
    return fixes


def mismatch_message(fingerprints: list[dict], *, most: int = 3) -> str | None:
    """The error for ranks whose fingerprint differs from rank 0's (the first ``most`` named), or None.

    >>> full = fingerprint(np.array([3, 5, 2]), seed=0)
    >>> print(mismatch_message([full, full]))
    None
    >>> print(mismatch_message([full, fingerprint(np.array([3, 5]), seed=0), {**full, "seed": 2}]))
    MultipackBatchSampler was built from different inputs on different ranks: rank 1 has 2 examples
    (8 tokens), rank 0 has 3 (10 tokens); rank 2 has seed=2, rank 0 has seed=0. Every rank plans
    the epoch for all ranks, so they would plan different numbers of steps and training would hang.
    Fix: every rank must build the sampler from the same dataset (loaded, filtered and ordered the
    same way, and all of it: the sampler deals the batches to the ranks, so do not shard the dataset
    by rank); pass the same seed on every rank.
    """
    found, what, ranks = [], [], 0
    for rank, mine in enumerate(fingerprints[1:], start=1):
        differences, differ_in = _differences(rank, mine, fingerprints[0])
        if differences:
            ranks += 1
            what += differ_in
            found += differences if ranks <= most else []
    if not ranks:
        return None
    if ranks > most:
        found.append(f"and {ranks - most} more rank(s) differ from rank 0")
    return (
        f"MultipackBatchSampler was built from different inputs on different ranks: {'; '.join(found)}. "
        "Every rank plans the epoch for all ranks, so they would plan different numbers of steps and "
        f"training would hang. Fix: {'; '.join(_fixes(what))}."
    )


def check_ranks_agree(mine: dict, *, num_replicas: int, rank: int) -> None:
    """Raise :func:`mismatch_message`'s error on every rank when the ranks' fingerprints differ.

    It runs when ``torch.distributed`` is initialised with ``num_replicas`` > 1 ranks and this
    process is ``rank``, i.e. the sampler's ranks are the process group's; then it is one
    collective, so every rank must build its sampler (as training needs anyway). Samplers
    planned for other ranks or another world size (a process replaying every rank's
    batches) exchange nothing. ``all_gather_object`` runs on gloo (CPU) and on NCCL (the
    current CUDA device, which ``torch.cuda.set_device`` must have set per rank, as DDP needs).
    """
    if num_replicas < 2 or not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() != num_replicas or dist.get_rank() != rank:
        return
    fingerprints: list = [None] * num_replicas
    dist.all_gather_object(fingerprints, mine)
    message = mismatch_message(fingerprints)
    if message is not None:
        raise ValueError(message)
