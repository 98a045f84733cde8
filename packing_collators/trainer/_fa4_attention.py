"""``packing_fa4``: FlashAttention-4's varlen kernel called straight from a packed batch.

transformers' own ``flash_attention_4`` runs the same kernel, but each call first goes through
its generic flash-attention layer (PEFT dtype checks, kwargs mapping, a packed-sequence test on
``position_ids`` that launches six small kernels per layer on transformers 5.17). On a model
small enough to be launch-bound (200M parameters at 16k tokens per step), that host time is GPU
idle time. This backend reads ``cu_seq_lens_q/k`` and ``max_length_q/k`` from the batch and
calls ``flash_attn.cute.flash_attn_varlen_func`` with nothing in between::

    register_fa4_attention()
    model.set_attn_implementation("packing_fa4")

Same kernel, same arguments as transformers passes (causal, softmax scale, sliding window as
``(w - 1, 0)``, logit softcapping, attention sinks as ``learnable_sink``); what it cannot do
(dropout, padded batches, decoding with a cache) is refused with an error naming the
alternative.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FA4_ATTENTION", "fa4_attention_forward", "register_fa4_attention"]

FA4_ATTENTION = "packing_fa4"
"""The ``attn_implementation`` name :func:`register_fa4_attention` registers."""

_KERNEL: list = []  # flash_attn.cute.flash_attn_varlen_func, imported on first use


def register_fa4_attention() -> str:
    """Register :func:`fa4_attention_forward` with transformers as ``packing_fa4`` (idempotent).

    Also registers transformers' flash-attention mask function for it, so that no dense mask
    is built. Returns the name to pass as ``attn_implementation``. Needs flash-attn-4 only
    when the model runs.

    >>> register_fa4_attention()
    'packing_fa4'
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(FA4_ATTENTION, fa4_attention_forward)
    AttentionMaskInterface.register(FA4_ATTENTION, flash_attention_mask)
    return FA4_ATTENTION


def _kernel():
    if not _KERNEL:
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except ImportError:
            raise ImportError(
                f"attn_implementation={FA4_ATTENTION!r} needs FlashAttention-4 (pip install "
                "'packing-collators[flash-attn]' on a Hopper or Blackwell GPU). Use 'packing_varlen' elsewhere."
            ) from None
        _KERNEL.append(flash_attn_varlen_func)
    return _KERNEL[0]


def _refuse(what: str, fix: str) -> None:
    raise ValueError(f"attn_implementation={FA4_ATTENTION!r} {what}. {fix}")


def fa4_attention_forward(
    module: Any,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    cu_seq_lens_q=None,
    cu_seq_lens_k=None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs,
):
    """Attention over a packed batch with FA4's varlen kernel (a transformers attention function).

    Args as transformers passes them: query (b, heads, s, head_dim), key/value (b, kv_heads,
    s, head_dim), the ``b * s`` tokens one flat sequence split by ``cu_seq_lens_q/k``;
    ``max_length_q/k`` Python ints. Returns ``(output, None)``, output (b, s, heads, head_dim).

    >>> import torch
    >>> q = k = v = torch.zeros(1, 2, 3, 4)
    >>> fa4_attention_forward(None, q, k, v, None)
    Traceback (most recent call last):
    ...
    ValueError: attn_implementation='packing_fa4' needs cu_seq_lens_q/k and max_length_q/k in the batch, and this batch has none. Collate with FlatteningCollator(), or use attn_implementation='flash_attention_4' for padded batches.
    """
    if cu_seq_lens_q is None or max_length_q is None:
        _refuse(
            "needs cu_seq_lens_q/k and max_length_q/k in the batch, and this batch has none",
            "Collate with FlatteningCollator(), or use attn_implementation='flash_attention_4' for padded batches.",
        )
    if attention_mask is not None:
        _refuse("got an attention_mask: it runs flattened batches only", "Collate with FlatteningCollator().")
    if dropout:
        _refuse(
            f"has no attention dropout (got dropout={dropout})",
            "Set model.config.attention_dropout = 0.0, or use 'flash_attention_2'.",
        )
    if query.shape[2] != key.shape[2]:
        _refuse(
            "is for training on packed batches, but queries and keys differ in length (decoding with a cache)",
            "Generate with attn_implementation='sdpa' or 'flash_attention_4'.",
        )
    batch, heads, length, dim = query.shape
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], value.shape[3])
    cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    is_causal = kwargs.get("is_causal")
    out = _kernel()(
        q,
        k,
        v,
        cu_seqlens_q=cu_seq_lens_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=int(max_length_q),
        max_seqlen_k=int(max_length_q if max_length_k is None else max_length_k),
        softmax_scale=scaling,
        causal=getattr(module, "is_causal", True) if is_causal is None else is_causal,
        window_size=(sliding_window - 1, 0) if sliding_window else (None, None),
        learnable_sink=kwargs.get("s_aux"),
        softcap=softcap or 0.0,
    )
    out = out[0] if isinstance(out, tuple) else out
    return out.view(batch, length, heads, out.shape[-1]), None
