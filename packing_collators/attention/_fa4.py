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
``(w - 1, 0)`` causal or ``(w - 1, w - 1)`` bidirectional, logit softcapping, attention sinks as
``learnable_sink``, ``deterministic`` / ``FLASH_ATTENTION_DETERMINISTIC``), with q/k/v cast to
autocast's half dtype as transformers does; what it cannot do (dropout, float32 activations,
padded batches, decoding with a cache) is refused with an error naming the alternative.

FA4 compiles each kernel variant the first time a process meets it (seconds each): importing this library turns
on FA4's own disk cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``, under ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``
or the temp folder, keyed by FA4's source), so a second run starts with them compiled; set the variable to 0 first
to keep FA4's default (memory only).

Under ``torch.compile`` the same call goes through the custom op ``packing_collators::fa4_varlen_fwd``
(``_fa4_ops``: a fake implementation for tracing, FA4's own backward as autograd), so the
graph does not break at every layer; eager calls are unchanged.
"""

from __future__ import annotations

import os
from typing import Any

from ._fa4_replay import record_fa4_call
from ._inputs import packed_inputs

__all__ = ["FA4_ATTENTION", "fa4_attention_forward", "kernel_call", "op_call", "register_fa4_attention"]

FA4_ATTENTION = "packing_fa4"
"""The ``attn_implementation`` name :func:`register_fa4_attention` registers."""

_KERNEL: list = []  # flash_attn.cute.flash_attn_varlen_func, imported on first use
FA4_DISK_CACHE = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"


def keep_fa4_kernels_on_disk(environ) -> str:
    """FA4's disk cache on unless the user chose (FA4 reads the variable once, when ``flash_attn.cute`` is imported).

    >>> keep_fa4_kernels_on_disk({}), keep_fa4_kernels_on_disk({FA4_DISK_CACHE: "0"})
    ('1', '0')
    """
    return environ.setdefault(FA4_DISK_CACHE, "1")


keep_fa4_kernels_on_disk(os.environ)


def register_fa4_attention() -> str:
    """Register :func:`fa4_attention_forward` with transformers as ``packing_fa4`` (idempotent).

    Also registers transformers' flash-attention mask function for it, so that no dense mask
    is built, and the custom ops a compiled model calls FA4 through (``_fa4_ops``).
    Returns the name to pass as ``attn_implementation``. Needs flash-attn-4 only when the
    model runs.

    >>> register_fa4_attention()
    'packing_fa4'
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    from . import _fa4_ops  # noqa: F401  (registers the custom ops torch.compile traces FA4 through)

    AttentionInterface.register(FA4_ATTENTION, fa4_attention_forward)
    AttentionMaskInterface.register(FA4_ATTENTION, flash_attention_mask)
    return FA4_ATTENTION


def _kernel(query):
    """FA4's varlen function, or an error saying why it cannot run on ``query``.

    >>> import torch
    >>> _kernel(torch.zeros(2, 1, 4))
    Traceback (most recent call last):
    ...
    ValueError: attn_implementation='packing_fa4' needs bf16 or fp16 activations, got torch.float32. Load the model with dtype=torch.bfloat16, or train under autocast (Trainer bf16=True / fp16=True).
    """
    _check_dtype(query)
    if not _KERNEL:
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except ImportError:
            raise ImportError(
                f"attn_implementation={FA4_ATTENTION!r} needs FlashAttention-4 (pip install "
                "'packing-collators[fa4]' on a Hopper or Blackwell GPU). Use 'packing_varlen' elsewhere."
            ) from None
        _KERNEL.append(flash_attn_varlen_func)
    return _KERNEL[0]


def _check_dtype(query) -> None:
    import torch

    if query.dtype not in (torch.float16, torch.bfloat16):
        _refuse(
            f"needs bf16 or fp16 activations, got {query.dtype}",
            "Load the model with dtype=torch.bfloat16, or train under autocast (Trainer bf16=True / fp16=True).",
        )


def _refuse(what: str, fix: str) -> None:
    raise ValueError(f"attn_implementation={FA4_ATTENTION!r} {what}. {fix}")


def _deterministic(requested: bool | None) -> bool:
    """transformers' rule: the layer's ``deterministic`` kwarg, else ``FLASH_ATTENTION_DETERMINISTIC=1``
    (which ``Trainer(full_determinism=True)`` sets): FA4's deterministic backward."""
    return bool(requested) if requested is not None else os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"


def fa4_attention_forward(module: Any, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """Attention over a packed batch with FA4's varlen kernel (a transformers attention function).

    Args as transformers passes them: query (b, heads, s, head_dim), key/value (b, kv_heads,
    s, head_dim), the ``b * s`` tokens one flat sequence split by ``cu_seq_lens_q/k``;
    ``max_length_q/k`` Python ints. float32 q/k/v under autocast are cast to its half dtype.
    Returns ``(output, None)``, output (b, s, heads, head_dim).

    >>> import torch
    >>> q = k = v = torch.zeros(1, 2, 3, 4)
    >>> fa4_attention_forward(None, q, k, v, None)
    Traceback (most recent call last):
    ...
    ValueError: attn_implementation='packing_fa4' needs cu_seq_lens_q/k and max_length_q/k in the batch (model(**batch) passes them to every attention layer); this batch has none. Collate with FlatteningCollator(), or use attn_implementation='sdpa' for padded batches.
    """
    import torch

    if attention_mask is not None:
        _refuse("got an attention_mask: it runs flattened batches only", "Collate with FlatteningCollator().")
    if dropout:
        _refuse(
            f"has no attention dropout (got dropout={dropout})",
            "Set model.config.attention_dropout = 0.0, or use 'flash_attention_2'.",
        )
    x = packed_inputs(module, query, key, value, kwargs, name=FA4_ATTENTION)
    batch, heads, length, _ = x.query.shape
    sink, deterministic = kwargs.get("s_aux"), _deterministic(kwargs.get("deterministic"))
    softcap = kwargs.get("softcap") or 0.0
    options = {"scale": scaling, "causal": x.causal, "window": x.window, "sink": sink, "softcap": softcap,
               "deterministic": deterministic}  # fmt: skip
    if torch.compiler.is_compiling():  # traced: FA4 as one custom-op node of the graph (_fa4_ops)
        _check_dtype(x.query)  # the eager path's refusal, at trace time
        out = op_call(*x.flat(), x.cu_q, x.cu_k, x.max_q, x.max_k, **options)
    else:
        record_fa4_call(module, x, scale=scaling, sliding_window=kwargs.get("sliding_window"), softcap=softcap,
                        sink=sink, deterministic=deterministic)  # fmt: skip  (only while a warm-up records)
        out = kernel_call(*x.flat(), x.cu_q, x.cu_k, x.max_q, x.max_k, **options)
    return out.view(batch, length, heads, out.shape[-1]), None


def kernel_call(q, k, v, cu_q, cu_k, max_q: int, max_k: int, *, scale, causal: bool, window: tuple[int, int], sink,
                softcap: float, deterministic: bool):  # fmt: skip
    """FA4's varlen function on flat q (T, heads, d), k/v (T, kv_heads, d): out (T, heads, d_v). The one eager
    call, which the forward and the warm-up's replays (``_warm_up.replay``) both make: the same arguments, so the
    same kernel variants. ``window`` (left, right), -1 for an unbounded side."""
    left, right = window
    out = _kernel(q)(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
        softmax_scale=scale, causal=causal, window_size=(None, None) if left < 0 else (left, right),
        learnable_sink=sink, softcap=softcap, deterministic=deterministic,
    )  # fmt: skip  (no window: (None, None), as transformers passes it)
    return out[0] if isinstance(out, tuple) else out


def op_call(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, causal: bool, window: tuple[int, int], sink, softcap: float,
            deterministic: bool):  # fmt: skip
    """:func:`kernel_call`'s call through the custom op :func:`fa4_varlen` (what Dynamo traces, and what a compiled
    layer's recorded call replays through); no window is ``(-1, -1)`` there."""
    from ._fa4_ops import fa4_varlen

    left, right = window
    return fa4_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, causal=causal,
                      window=(left, right) if left >= 0 else (-1, -1), softcap=softcap, sink=sink,
                      deterministic=deterministic)  # fmt: skip
