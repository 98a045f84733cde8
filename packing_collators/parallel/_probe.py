"""The live probe through the sequence-parallel path: shards and all-to-alls keep examples apart.

Three synthetic examples are packed into one row, cut into the group's shards and run through the
model's Ulysses attention on every rank of the group; the shards' logits are gathered back into the row::

    packed row  [ A A A A A A A | B B B B B | C C C C C C C C C | pad ]   cut at T/n: A|B and B|C cross edges
    (a) leak:   B's tokens changed -> A's and C's logits exactly equal (a wrong mask, a shard that
                sees another's tokens, a misrouted all-to-all all move them)
    (b) exact:  every token's logits equal the same row run whole on one rank (no Ulysses), within
                the dtype's tolerance (positions, head order and the shift at shard edges)

The verdict is taken over the whole world (an all-reduce of both numbers), so every rank raises or
none does. Cost: three forwards over ~24 tokens, once before training.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from .._compat import attn_implementation

__all__ = ["probe_sequence_parallel"]

_TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "bfloat16": 5e-2, "float16": 2e-2}
_LENGTHS = (7, 5, 9)


def _tokens(config, seed: int) -> list[list[int]]:
    special = set()
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(config, key, None)
        special.update(value if isinstance(value, (list, tuple)) else [value])
    allowed = np.array([t for t in range(min(int(config.vocab_size), 4096)) if t not in special])
    rng = np.random.default_rng(seed)
    return [rng.choice(allowed, size=n).tolist() for n in _LENGTHS]


def _inputs(batch: dict, device) -> dict:
    import torch

    drop = ("labels", "shift_labels")
    return {
        k: (torch.as_tensor(v).to(device) if isinstance(v, (np.ndarray, torch.Tensor)) else v)
        for k, v in batch.items()
        if k not in drop
    }


def _gathered_logits(model, shard: dict, mesh, device) -> np.ndarray:
    """This rank's shard through the model, the group's logits gathered back into the row: (T, V)."""
    import torch
    import torch.distributed as dist

    output = model(**_inputs(shard, device))
    local = (output.logits if hasattr(output, "logits") else output[0]).detach().float()[0].contiguous()
    pieces = [torch.empty_like(local) for _ in range(mesh.size)]
    dist.all_gather(pieces, local, group=mesh.sp_group)
    return torch.cat(pieces).cpu().numpy()


def _world_max(values: list[float], device) -> list[float]:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def probe_sequence_parallel(model, mesh, collator=None, *, autocast=None):
    """Run the probe above on ``model`` (Ulysses enabled) over ``mesh``; returns a ``ProbeReport``.

    ``collator``: the one training collates with before the cut (default :class:`FlatteningCollator`).
    Every rank of the world must call it (it runs collectives); the report is the same on each.
    """
    import torch

    from ..collate import FlatteningCollator
    from ..trainer import ProbeReport
    from ._shard import shard_flat_batch
    from ._ulysses import _text_config, inner_attention

    collator = FlatteningCollator() if collator is None else collator
    config = _text_config(model)
    parameter = next(model.parameters())
    started = time.perf_counter()
    examples = _tokens(config, seed=0)
    changed = [examples[0], _tokens(config, seed=1)[1], examples[2]]
    rows = [collator([{"input_ids": ids} for ids in row]) for row in (examples, changed)]
    total = int(np.asarray(rows[0]["input_ids"]).shape[1])
    was_training = model.training
    model.eval()
    # a varlen kernel runs with autograd on, as in training (FA4 compiles no extra variant for the probe)
    grad = torch.no_grad() if attn_implementation(config).endswith(("sdpa", "eager")) else torch.enable_grad()
    try:
        with grad, autocast or contextlib.nullcontext():
            shards = [shard_flat_batch(row, rank=mesh.sp_rank, size=mesh.size) for row in rows]
            packed, leaked = (_gathered_logits(model, shard, mesh, parameter.device)[:total] for shard in shards)
            with inner_attention(model):
                output = model(**_inputs(rows[0], parameter.device))
            whole = (output.logits if hasattr(output, "logits") else output[0]).detach().float()[0].cpu().numpy()
    finally:
        model.train(was_training)
    others = np.r_[0 : _LENGTHS[0], sum(_LENGTHS[:2]) : sum(_LENGTHS)]
    leak, difference = _world_max(
        [float(np.abs(packed[others] - leaked[others]).max()), float(np.abs(packed - whole).max())], parameter.device
    )
    dtype = str(getattr(autocast, "fast_dtype", None) or parameter.dtype).replace("torch.", "")
    return ProbeReport(
        model=type(model).__name__,
        implementation=f"{attn_implementation(config)}, sequence_parallel_size={mesh.size}",
        dtype=dtype,
        device=str(parameter.device),
        lengths=_LENGTHS,
        max_difference=difference,
        tolerance=_TOLERANCE.get(dtype, 5e-2) * max(1.0, float(np.abs(whole).max())),
        leak=leak,
        culprit=None,
        seconds=time.perf_counter() - started,
    )
