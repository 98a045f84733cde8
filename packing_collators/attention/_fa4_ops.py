"""FlashAttention-4's varlen kernel as ``torch.library`` custom ops, so ``torch.compile`` traces through it.

Under ``torch.compile`` a kernel written outside PyTorch (FA4 is CuTe DSL, JIT-compiled from
Python) breaks the graph: Dynamo cannot trace its Python. Wrapped as an opaque custom op with a
fake (shape-only) implementation and an autograd formula, it is one node of the graph::

    packing_collators::fa4_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, ...) -> (out, lse)
        q (T, heads, d), k/v (T, kv_heads, d), cu int32 (n + 1,), max_q/max_k SymInt
        out (T, heads, d_v) like q;  lse float32 (heads, T): what the backward needs
    packing_collators::fa4_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, ...)
        -> (dq, dk, dv, dsink)        dsink: (heads,) float32, or empty without attention sinks

``max_q`` / ``max_k`` are ``int`` in Python and ``SymInt`` in the schema: under dynamic shapes
they stay symbolic, so a new longest sequence reuses the graph instead of specialising a new
one. Both ops call FA4's varlen forward / backward (``_compat.fa4_kernels``) with what
``flash_attn_varlen_func`` passes them (the forward asks for the lse: inside a custom op autograd
is off, so FA4 would not keep it otherwise). Eager training does not go through these ops
(:func:`fa4_attention_forward` calls FA4 directly, as before); only a traced forward does.
PyTorch's own ``varlen_attn`` is a custom op already (``torch_attn::_varlen_attn``, with a fake
and a backward), so ``packing_varlen`` needs no wrapper. Cost: one dispatcher call per layer and
direction on top of the kernel, in compiled graphs only.
"""

from __future__ import annotations

import torch

from .._compat import fa4_kernels
from ._fa4_replay import record_fa4_op_call

__all__ = ["ATTENTION_OPS", "fa4_varlen"]

ATTENTION_OPS = ("packing_collators::fa4_varlen_fwd", "packing_collators::fa4_varlen_bwd")
"""The custom ops this module registers (on import)."""


def _interface():
    """``(forward, backward)``: FA4's varlen kernels (see ``fa4_kernels``; tests stand in a reference)."""
    try:
        return fa4_kernels()
    except ImportError:
        raise ImportError(
            "attn_implementation='packing_fa4' needs FlashAttention-4 (pip install 'packing-collators[fa4]' on a "
            "Hopper or Blackwell GPU). Use 'packing_varlen' elsewhere."
        ) from None


def _window(left: int, right: int) -> dict:
    """FA4's window keywords: ``-1`` (unbounded side) as None, as ``flash_attn_varlen_func`` passes it."""
    return {"window_size_left": None if left < 0 else left, "window_size_right": None if right < 0 else right}


# The arguments both ops take after their tensors, written once. An explicit schema (rather than one
# inferred from annotations) also registers under torch 2.4, whose inference rejects string annotations.
_KERNEL_ARGS = (
    "Tensor cu_q, Tensor cu_k, SymInt max_q, SymInt max_k, float? scale, bool causal, int window_left, "
    "int window_right, float softcap, Tensor? sink, bool deterministic"
)


@torch.library.custom_op(
    "packing_collators::fa4_varlen_fwd", mutates_args=(), schema=f"(Tensor q, Tensor k, Tensor v, {_KERNEL_ARGS}) -> (Tensor, Tensor)"
)
def _fa4_fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window_left, window_right, softcap, sink, deterministic):
    forward, _ = _interface()  # (deterministic is the backward's: kept here for its setup)
    record_fa4_op_call(q, k, v, scale=scale, causal=causal, window=(window_left, window_right), softcap=softcap,
                       sink=sink, deterministic=deterministic)  # fmt: skip  (only while a warm-up records)
    out, lse, *_ = forward(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
        softmax_scale=scale, causal=causal, softcap=softcap, learnable_sink=sink, return_lse=True,
        **_window(window_left, window_right),
    )  # fmt: skip
    return out, lse


@_fa4_fwd.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window_left, window_right, softcap, sink, deterministic):
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op(
    "packing_collators::fa4_varlen_bwd",
    mutates_args=(),
    schema=f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_KERNEL_ARGS}) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
)
def _fa4_bwd(
    dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, window_left, window_right, softcap, sink, deterministic
):
    _, backward = _interface()
    grads = backward(
        q, k, v, out, dout.contiguous(), lse, scale, causal, softcap, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=max_q, max_seqlen_k=max_k, deterministic=deterministic, learnable_sink=sink,
        **_window(window_left, window_right),
    )  # fmt: skip
    dq, dk, dv = grads[:3]
    dsink = grads[3] if sink is not None else q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, dsink


@_fa4_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr, softcap, sink, deterministic):
    dsink = torch.empty_like(sink) if sink is not None else q.new_empty((0,), dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsink


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, left, right, softcap, sink, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sink)
    ctx.options = (max_q, max_k, scale, causal, left, right, softcap)
    ctx.deterministic, ctx.has_sink = deterministic, sink is not None


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, sink = ctx.saved_tensors
    max_q, max_k, scale, causal, left, right, softcap = ctx.options
    dq, dk, dv, dsink = torch.ops.packing_collators.fa4_varlen_bwd(
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, left, right, softcap, sink,
        ctx.deterministic,
    )  # fmt: skip
    return dq, dk, dv, *(None,) * 9, dsink if ctx.has_sink else None, None


_fa4_fwd.register_autograd(_backward, setup_context=_setup_context)


def fa4_varlen(
    q,
    k,
    v,
    cu_q,
    cu_k,
    max_q,
    max_k,
    *,
    scale: float | None,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
    sink=None,
    deterministic: bool = False,
):
    """FA4's varlen attention through the custom ops: out (T, heads, d_v), differentiable in q, k, v (and sink).

    ``window`` is ``(left, right)`` with -1 for an unbounded side. On a machine without FA4 a test
    can stand a reference in for :func:`_interface`.

    >>> torch.ops.packing_collators.fa4_varlen_fwd.default.name()
    'packing_collators::fa4_varlen_fwd'
    """
    left, right = window
    out, _ = torch.ops.packing_collators.fa4_varlen_fwd(
        q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, left, right, softcap, sink, deterministic
    )
    return out
