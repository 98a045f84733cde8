"""The live probe through the sequence-parallel path: shards and all-to-alls keep examples apart.

Three synthetic examples are packed into one row, cut into the group's shards and run through the
model's Ulysses attention on every rank of the group; the shards' logits are gathered back into the row::

    packed row  [ A A A A A A A | B B B B B | C C C C C C C C C | pad ]   cut at T/n: A|B and B|C cross edges
    (a) leak:   B's tokens changed -> A's and C's logits exactly equal (a wrong mask, a shard that
                sees another's tokens, a misrouted all-to-all all move them)
    (b) exact:  every token's logits equal the same row run whole on one rank (no Ulysses), within
                the dtype's tolerance (positions, head order and the shift at shard edges)

Routed experts run one token at a time (``checks/_probe_experts.py``), so that a shard's expert
matmuls, shaped by its own tokens, cannot round the leak test. The verdict is taken over the whole
world (an all-reduce of the numbers), so every rank raises or none does. Cost: three forwards over
~24 tokens, once before training.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from .._compat import attn_implementation
from .._model_unwrap import text_config
from ..checks import (
    PROBE_LENGTHS,
    ProbeReport,
    model_inputs,
    output_logits,
    probe_dtype,
    synthetic_tokens,
    tokenwise_experts,
    tolerance,
)

__all__ = ["probe_sequence_parallel"]


def _gathered_logits(model, shard: dict, mesh, device) -> np.ndarray:
    """This rank's shard through the model, the group's logits gathered back into the row: (T, V)."""
    import torch
    import torch.distributed as dist

    local = output_logits(model(**model_inputs(shard, device))).detach().float()[0].contiguous()
    pieces = [torch.empty_like(local) for _ in range(mesh.size)]
    dist.all_gather(pieces, local, group=mesh.sp_group)
    return torch.cat(pieces).cpu().numpy()


def _world_max(values: list[float], device) -> list[float]:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def probe_sequence_parallel(model, mesh, collator=None, *, autocast=None) -> ProbeReport:
    """Run the probe above on ``model`` (Ulysses enabled) over ``mesh``; returns a ``ProbeReport``.

    ``collator``: the one training collates with before the cut (default :class:`FlatteningCollator`).
    Every rank of the world must call it (it runs collectives); the report is the same on each.
    """
    import torch

    from ..collate import FlatteningCollator
    from ._shard import shard_flat_batch
    from ._ulysses import inner_attention

    collator = FlatteningCollator() if collator is None else collator
    config = text_config(model)
    parameter = next(model.parameters())
    started = time.perf_counter()
    examples = [ids.tolist() for ids in synthetic_tokens(config, PROBE_LENGTHS, seed=0)]
    changed = [examples[0], synthetic_tokens(config, PROBE_LENGTHS, seed=1)[1].tolist(), examples[2]]
    rows = [collator([{"input_ids": ids} for ids in row]) for row in (examples, changed)]
    total = int(np.asarray(rows[0]["input_ids"]).shape[1])
    was_training = model.training
    model.eval()
    # a varlen kernel runs with autograd on, as in training (FA4 compiles no extra variant for the probe)
    grad = torch.no_grad() if attn_implementation(config).endswith(("sdpa", "eager")) else torch.enable_grad()
    try:  # routed experts one token at a time: a shard's expert matmuls round by its own tokens
        with grad, autocast or contextlib.nullcontext(), tokenwise_experts(model) as experts:
            shards = [shard_flat_batch(row, rank=mesh.sp_rank, size=mesh.size) for row in rows]
            packed, leaked = (_gathered_logits(model, shard, mesh, parameter.device)[:total] for shard in shards)
            with inner_attention(model):
                output = output_logits(model(**model_inputs(rows[0], parameter.device)))
            whole = output.detach().float()[0].cpu().numpy()
    finally:
        model.train(was_training)
    others = np.r_[0 : PROBE_LENGTHS[0], sum(PROBE_LENGTHS[:2]) : sum(PROBE_LENGTHS)]
    leak, difference, experts.difference, experts.scale = _world_max(
        [
            float(np.abs(packed[others] - leaked[others]).max()),
            float(np.abs(packed - whole).max()),
            experts.difference,
            experts.scale,
        ],
        parameter.device,
    )
    dtype = probe_dtype(autocast, parameter)
    return ProbeReport(
        model=type(model).__name__,
        implementation=f"{attn_implementation(config)}, sequence_parallel_size={mesh.size}",
        dtype=dtype,
        device=str(parameter.device),
        lengths=PROBE_LENGTHS,
        max_difference=difference,
        tolerance=tolerance(dtype, whole),
        leak=leak,
        culprit=None,
        seconds=time.perf_counter() - started,
        **experts.report_fields(dtype),
    )
