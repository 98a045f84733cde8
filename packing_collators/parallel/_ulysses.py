"""Ulysses attention: all-to-all from sequence shards to head shards, the kernel over the whole row, and back.

Each rank of a group of ``n`` holds ``T / n`` tokens of one packed row and every head. Around the
model's own attention kernel (any implementation registered with transformers)::

    q, k, v on rank r : (1, H, T/n, D)    its tokens, all heads
       -- all-to-all -->  (1, H/n, T, D)   every token, heads r*H/n .. (r+1)*H/n - 1
    kernel over the whole row with the global cu_seq_lens (varlen kernels read them; for sdpa/eager a
    block-diagonal causal mask, with the sliding window if the layer has one, is built from them)
       out (1, T, H/n, D) -- all-to-all --> (1, T/n, H, D)   back to this rank's tokens

Grouped-query attention: k/v heads are split the same way when ``n`` divides their number; with
fewer (1 kv head, n = 2) each k/v head is repeated ``lcm(kv, n) / kv`` times first, which keeps every
query head with its own k/v head. Query heads that ``n`` does not divide are refused
(:func:`check_sequence_parallel_model`). The all-to-all is an autograd function (its backward is the
same exchange), so gradients come back to the rank that owns each token.
Cost per layer: two all-to-alls of q/k/v (3 x T/n x H x D elements per rank, k/v fewer under GQA) and
one of the output; the kernel's work per rank is 1/n of the whole row's.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .._compat import attention_registry, attn_implementation, set_attn_implementation
from .._model_unwrap import text_config
from ..batch import CU_SEQ_LENS_Q

__all__ = ["ULYSSES_PREFIX", "check_sequence_parallel_model", "enable_ulysses_attention", "inner_attention"]

ULYSSES_PREFIX = "ulysses_"
"""Ulysses around implementation X is registered as ``"ulysses_" + X``."""

_VARLEN_KINDS = ("flash_attention", "packing_varlen", "packing_fa4")
_OWN_MASK = ("sdpa", "eager")


def _all_to_all(tensor, group):
    import torch.distributed as dist

    out = tensor.new_empty(tensor.shape)
    dist.all_to_all_single(out, tensor.contiguous(), group=group)
    return out


@functools.lru_cache(maxsize=1)
def _exchange_function():
    import torch

    class _Exchange(torch.autograd.Function):
        """all_to_all_single over the first dimension; its backward is the same exchange."""

        @staticmethod
        def forward(ctx, tensor, group):
            ctx.group = group
            return _all_to_all(tensor, group)

        @staticmethod
        def backward(ctx, grad):
            return _all_to_all(grad, ctx.group), None

    return _Exchange


def _to_heads(x, group, size: int):
    """(1, H, t, D) sequence shard -> (1, H/size, size*t, D) head shard."""
    _, heads, t, dim = x.shape
    chunks = x.reshape(size, heads // size, t, dim)  # chunk j goes to rank j
    received = _exchange_function().apply(chunks, group)  # received[i]: rank i's tokens, my heads
    return received.permute(1, 0, 2, 3).reshape(1, heads // size, size * t, dim)


def _to_tokens(out, group, size: int):
    """(1, T, H/size, D) head shard -> (1, T/size, H, D) sequence shard."""
    _, total, heads, dim = out.shape
    chunks = out.reshape(size, total // size, heads, dim)  # chunk i: rank i's tokens
    received = _exchange_function().apply(chunks, group)  # received[j]: my tokens, rank j's heads
    return received.permute(1, 0, 2, 3).reshape(1, total // size, size * heads, dim)


def _repeat_kv(key, value, size: int):
    """Repeat k/v heads so ``size`` divides their number, keeping each query head on its own k/v head."""
    kv = key.shape[1]
    if kv % size == 0:
        return key, value
    repeat = math.lcm(kv, size) // kv
    return key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)


def _packed_mask(cu_seq_lens, total: int, sliding_window):
    """(1, 1, T, T) bool mask: causal within each sequence of ``cu_seq_lens`` (and within the window)."""
    import torch

    cu = cu_seq_lens.long()
    segment = torch.repeat_interleave(torch.arange(len(cu) - 1, device=cu.device), cu.diff())
    index = torch.arange(total, device=cu.device)
    allowed = (segment[:, None] == segment[None, :]) & (index[None, :] <= index[:, None])
    if sliding_window:
        allowed &= index[:, None] - index[None, :] < int(sliding_window)
    return allowed[None, None]


def _masked_attention(query, key, value, kwargs: dict):
    """sdpa/eager over the whole row: the packed mask from the global cu_seq_lens, k/v repeated to the query heads."""
    import torch

    cu = kwargs.get(CU_SEQ_LENS_Q)
    if cu is None:
        raise ValueError(
            "Sequence-parallel attention needs the global cu_seq_lens_q in the batch; collate with "
            "SequenceShardCollator(FlatteningCollator(), ...)."
        )
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(
                f"Sequence-parallel sdpa/eager builds a plain packed mask and has no {unsupported} (this model uses "
                "it); load the model with a varlen kernel that supports it (e.g. attn_implementation="
                "'flash_attention_2') instead."
            )
    groups = query.shape[1] // key.shape[1]
    key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    mask = _packed_mask(cu.to(query.device), query.shape[2], kwargs.get("sliding_window"))
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=kwargs.get("scaling"), dropout_p=0.0
    )
    return out.transpose(1, 2).contiguous()


def _ulysses_forward(inner_name: str, group, size: int):
    def ulysses_attention_forward(module, query, key, value, attention_mask, **kwargs: Any):
        key, value = _repeat_kv(key, value, size)
        q, k, v = (_to_heads(x, group, size) for x in (query, key, value))
        if inner_name in _OWN_MASK:
            out = _masked_attention(q, k, v, kwargs)
        else:
            kwargs.pop("position_ids", None)  # this rank's; the kernel reads the global cu_seq_lens
            out, _ = attention_registry()[inner_name](module, q, k, v, None, **kwargs)
        return _to_tokens(out, group, size), None

    ulysses_attention_forward.inner_name = inner_name
    return ulysses_attention_forward


def check_sequence_parallel_model(config, size: int) -> None:
    """Refuse a model whose attention ``size`` ranks cannot split exactly (query heads not divisible).

    >>> from transformers import LlamaConfig
    >>> check_sequence_parallel_model(LlamaConfig(num_attention_heads=4, num_key_value_heads=1, hidden_size=32), 2)
    >>> check_sequence_parallel_model(LlamaConfig(num_attention_heads=3, hidden_size=24), 2)
    Traceback (most recent call last):
    ...
    ValueError: sequence_parallel_size=2 must divide the model's attention heads (num_attention_heads=3): Ulysses gives each rank 3/2 heads. Use a sequence_parallel_size that divides 3 (e.g. 1), or sequence_parallel_size=1.
    """
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(heads, int):
        raise ValueError(
            f"Sequence parallelism splits attention heads, and {type(config).__name__} has no integer "
            "num_attention_heads; train this model with sequence_parallel_size=1."
        )
    if heads % size:
        divisors = [d for d in range(size, 0, -1) if heads % d == 0]
        raise ValueError(
            f"sequence_parallel_size={size} must divide the model's attention heads (num_attention_heads={heads}): "
            f"Ulysses gives each rank {heads}/{size} heads. Use a sequence_parallel_size that divides {heads} "
            f"(e.g. {divisors[0]}), or sequence_parallel_size=1."
        )
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}.")
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError(
            f"attention_dropout={config.attention_dropout}: dropout masks differ between the sequence-parallel "
            "and the single-GPU layout, so the loss cannot be exact. Set config.attention_dropout = 0.0."
        )


def enable_ulysses_attention(model, group, size: int) -> str:
    """Wrap ``model``'s attention implementation in Ulysses over ``group`` (``size`` ranks); return its name.

    Registers ``"ulysses_" + implementation`` with transformers (the function, and a mask function that
    builds no mask for the local shard) and sets it on the model. Implementations: ``sdpa`` and
    ``eager`` (a packed mask is built from ``cu_seq_lens``), or a varlen kernel that reads ``cu_seq_lens``
    (``packing_fa4``, ``packing_varlen``, ``flash_attention_*``). Anything else is refused.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    config = text_config(model)
    check_sequence_parallel_model(config, size)
    current = attn_implementation(config)
    inner = getattr(attention_registry().get(current), "inner_name", current)
    if inner not in _OWN_MASK and not inner.startswith(_VARLEN_KINDS):
        raise ValueError(
            f"attn_implementation={inner!r} cannot run sequence-parallel exactly: Ulysses needs a kernel that "
            "reads the global cu_seq_lens (packing_fa4, packing_varlen, flash_attention_2/3/4) or 'sdpa'/'eager' "
            "(for which it builds the packed mask). Load the model with one of those."
        )
    if inner not in _OWN_MASK and inner not in attention_registry():
        raise ValueError(
            f"attn_implementation={inner!r} is not registered with transformers' AttentionInterface; register it "
            "(e.g. register_fa4_attention()) before enabling sequence parallelism."
        )
    name = ULYSSES_PREFIX + inner
    AttentionInterface.register(name, _ulysses_forward(inner, group, size))
    AttentionMaskInterface.register(name, lambda *args, **kwargs: None)
    _set_implementation(model, name)
    return name


def _set_implementation(model, name: str) -> None:
    for config in {id(c): c for c in (model.config, text_config(model))}.values():
        set_attn_implementation(config, name)


class inner_attention:  # noqa: N801  (used as a context manager, like torch.no_grad)
    """Within the block, ``model`` runs its attention without Ulysses (the whole row on this rank).

    The reference the probe compares the sequence-parallel run with; outside Ulysses it does nothing.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.saved = None

    def __enter__(self):
        name = attn_implementation(text_config(self.model))
        inner = getattr(attention_registry().get(name), "inner_name", None)
        if inner is not None:
            self.saved = name
            _set_implementation(self.model, inner)
        return self.model

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            _set_implementation(self.model, self.saved)
