"""A transformers attention backend on PyTorch's own Flash varlen kernel, for packed batches.

``torch.nn.attention.varlen.varlen_attn`` (PyTorch >= 2.10, CUDA) runs the Flash
kernel on a flat ``(total_tokens, heads, head_dim)`` layout with ``cu_seq_lens``,
so a packed batch trains at Flash speed with no ``flash-attn`` install::

    batch from FlatteningCollator          what the kernel sees
    input_ids     = [[a b c d e f g h]]    q, k, v : (8, heads, head_dim)
    cu_seq_lens_q = [0, 3, 5, 8]           three causal blocks: abc | de | fgh
    max_length_q  = 3                      a Python int: no device sync

Register it once, then pass its name as the attention implementation::

    register_varlen_attention()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="packing_varlen")

The function reads ``cu_seq_lens_q/k`` and ``max_length_q/k`` from the keyword
arguments that transformers forwards from ``model(**batch)`` to every attention
layer; it never re-derives them (that would cost a device sync per layer).
Grouped-query attention passes the fewer k/v heads to the kernel as they are
(``enable_gqa`` where this PyTorch has the flag; PyTorch 2.10 gets them repeated),
float32 q/k/v under autocast are cast to its half dtype, sliding windows map to
``window_size=(w - 1, 0)`` (transformers' convention: a token sees itself and
``w - 1`` earlier ones), and
what the kernel cannot do (logit softcapping, attention sinks, dropout, padded
batches, decoding with a cache) is refused with an error naming the alternative.
Cost: the kernel call plus at most one int32 cast of ``cu_seq_lens`` per layer.

Flash only: PyTorch 2.14 sends some ``varlen_attn`` calls to cuDNN's ragged kernel instead
(cuDNN >= 9.18 on Hopper/Blackwell, window ``(-1, -1)``, no GQA; later builds causal ones
too), deciding again in the backward. Called as an aten op, that kernel gives wrong dq/dk
for a packed batch on the H100 image measured (cuDNN 9.19; docs/benchmarks.md, "FlashAttention-4"),
and the packing probe checks the forward pass only. Where ``varlen_attn`` can route to cuDNN,
an unbounded side of the window is therefore passed as the longest sequence (``-1`` becomes
``max_length_k``: the same attention, as every key of a sequence lies within it), which
cuDNN's path turns down in the forward and the backward, and which Flash reads as unbounded
again: the call stays on the Flash kernel this library was validated with.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ._inputs import packed_inputs

__all__ = ["VARLEN_ATTENTION", "register_varlen_attention", "varlen_attention_forward"]

VARLEN_ATTENTION = "packing_varlen"
"""The ``attn_implementation`` name :func:`register_varlen_attention` registers by default."""


def register_varlen_attention(name: str = VARLEN_ATTENTION) -> str:
    """Register :func:`varlen_attention_forward` with transformers under ``name`` (idempotent).

    Registers the attention function (``AttentionInterface``) and, so that no dense
    mask is built for it, transformers' flash-attention mask function
    (``AttentionMaskInterface``: ``None`` for a packed batch). Returns ``name``, the
    string to pass as ``attn_implementation``.

    >>> register_varlen_attention()
    'packing_varlen'
    >>> from packing_collators._compat import attention_registry
    >>> attention_registry()["packing_varlen"].__name__
    'varlen_attention_forward'
    """
    if not isinstance(name, str) or not name or name in _BUILTIN_NAMES:
        raise ValueError(
            f"name={name!r} cannot be used: pass a new non-empty string (the default is {VARLEN_ATTENTION!r}); "
            f"{sorted(_BUILTIN_NAMES)} are transformers' own implementations."
        )
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, varlen_attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


_BUILTIN_NAMES = frozenset(
    {"eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4", "paged|eager"}
)


def _load_varlen_attn(query) -> Callable:
    """PyTorch's ``varlen_attn``, or an error saying why it cannot run on ``query``."""
    import torch

    if query.device.type != "cuda":
        raise ValueError(
            f"attn_implementation={VARLEN_ATTENTION!r} runs PyTorch's Flash varlen kernel, which needs a CUDA "
            f"device; the model is on {query.device}. Use attn_implementation='sdpa' (or 'flex_attention') there."
        )
    if query.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"attn_implementation={VARLEN_ATTENTION!r} needs bf16 or fp16 activations, got {query.dtype}. "
            "Load the model with dtype=torch.bfloat16, or run under autocast (Trainer bf16=True / fp16=True), or use "
            "attn_implementation='sdpa'."
        )
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        raise ImportError(
            f"attn_implementation={VARLEN_ATTENTION!r} needs torch.nn.attention.varlen (PyTorch >= 2.10), "
            f"this is PyTorch {torch.__version__}. Upgrade PyTorch, or use 'flash_attention_2' (pip install "
            "flash-attn) or 'flex_attention'."
        ) from None
    return varlen_attn


def _signature_parameters(kernel: Callable) -> frozenset:
    """Names of the keyword arguments ``kernel`` takes (they grew between PyTorch releases)."""
    return frozenset(inspect.signature(kernel).parameters)


_kernel_parameters = functools.lru_cache(maxsize=8)(_signature_parameters)


def _refuse_unsupported(attention_mask, dropout: float, softcap, kwargs: dict) -> None:
    if attention_mask is not None:
        raise ValueError(
            f"attn_implementation={VARLEN_ATTENTION!r} got an attention_mask: it only handles flattened batches "
            "(one row, cu_seq_lens_q/k, no attention_mask). Collate with FlatteningCollator, or use "
            "attn_implementation='sdpa' for padded batches."
        )
    if softcap is not None:
        raise ValueError(
            f"attn_implementation={VARLEN_ATTENTION!r}: PyTorch's varlen kernel has no logit softcapping, "
            f"which this model uses (softcap={softcap}). Use 'flash_attention_2' or 'flex_attention'."
        )
    if kwargs.get("s_aux") is not None:
        raise ValueError(
            f"attn_implementation={VARLEN_ATTENTION!r}: PyTorch's varlen kernel has no attention sinks (s_aux), "
            "which this model uses. Use 'flash_attention_3' or 'flex_attention'."
        )
    if dropout:
        raise ValueError(
            f"attn_implementation={VARLEN_ATTENTION!r}: PyTorch's varlen kernel has no attention dropout "
            f"(got dropout={dropout}). Set model.config.attention_dropout = 0.0, or use 'flash_attention_2'."
        )


def varlen_attention_forward(module: Any, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """Attention over a packed batch with ``torch.nn.attention.varlen.varlen_attn`` (a transformers attention function).

    Args (as transformers passes them):
        query: (b, heads, s, head_dim); key, value: (b, kv_heads, s, head_dim). The
            ``b * s`` tokens are one flat sequence split by ``cu_seq_lens_q/k``.
        attention_mask: must be ``None`` (flattened batches carry no mask).
        cu_seq_lens_q, cu_seq_lens_k: int32 (num_seqs + 1,), from the collator.
        max_length_q, max_length_k: Python ints, from the collator.

    Returns ``(output, None)`` with output (b, s, heads, head_dim). Runs on CUDA in
    bf16/fp16; elsewhere it raises and says what to use instead.

    >>> import torch
    >>> q = k = v = torch.zeros(1, 2, 3, 4)
    >>> varlen_attention_forward(None, q, k, v, None)
    Traceback (most recent call last):
    ...
    ValueError: attn_implementation='packing_varlen' needs cu_seq_lens_q/k and max_length_q/k in the batch (model(**batch) passes them to every attention layer); this batch has none. Collate with FlatteningCollator(), or use attn_implementation='sdpa' for padded batches.
    """
    import torch

    _refuse_unsupported(attention_mask, dropout, kwargs.get("softcap"), kwargs)
    x = packed_inputs(module, query, key, value, kwargs, name=VARLEN_ATTENTION)
    kernel = _load_varlen_attn(x.query)
    # traced, the signature is read afresh (Dynamo warns on a cache wrapper); its answer is a constant of the graph
    params = _signature_parameters(kernel) if torch.compiler.is_compiling() else _kernel_parameters(kernel)
    heads, kv_heads, head_dim = x.query.shape[1], x.key.shape[1], x.query.shape[-1]
    q, k, v = x.flat()  # (b, h, s, d) -> (b * s, h, d): a view when b == 1 (head_dim stays contiguous)
    options: dict[str, Any] = {}
    if kv_heads != heads:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        elif "window_size" not in params:  # PyTorch 2.10: repeat each kv head for its query group (as repeat_kv)
            k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
        # PyTorch 2.11 (window_size, no enable_gqa flag yet): its Flash kernel takes the fewer k/v heads
        # as they are; same output and gradients as repeated heads (benchmarks/results/gpu_varlen_gqa/)
    if scaling is not None:
        if "scale" in params:
            options["scale"] = scaling
        else:  # the kernel scales by 1/sqrt(head_dim); fold the difference into q
            q = q * (scaling * head_dim**0.5)
    window = x.window
    if "window_size" in params:
        if _varlen_can_pick_cudnn():  # keep it on Flash (module docstring)
            window = tuple(x.max_k if side == -1 else side for side in window)
        options["window_size"] = window
    elif window not in ((-1, 0), (-1, -1)):
        raise ValueError(
            f"This PyTorch's varlen_attn has no window_size, and the model uses sliding_window={kwargs.get('sliding_window')} "
            "on sequences longer than it. Upgrade PyTorch, or use 'flash_attention_2' or 'flex_attention'."
        )
    else:
        options["is_causal"] = window == (-1, 0)
    out = kernel(q, k, v, x.cu_q, x.cu_k, x.max_q, x.max_k, **options)
    return out.view(query.shape[0], query.shape[2], heads, out.shape[-1]), None


@functools.cache
def _varlen_can_pick_cudnn() -> bool:
    """Whether this PyTorch's ``varlen_attn`` may run cuDNN's ragged kernel instead of Flash's:
    2.14 decides in ``_can_use_cudnn``, later builds in ``_select_backend``; never on ROCm, whose
    builds may ignore a window (so a causal call must keep its unbounded ``(-1, 0)`` there)."""
    import torch

    if torch.version.hip is not None:
        return False
    try:
        from torch.nn.attention import varlen
    except ImportError:
        return False
    return hasattr(varlen, "_can_use_cudnn") or hasattr(varlen, "_select_backend")
