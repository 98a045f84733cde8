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
too), deciding again in the backward. Called as an aten op, that kernel returned wrong dq/dk
for a packed batch on the H100 image measured (cuDNN 9.19, ``benchmarks/gpu/packed_kernels.py``),
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


def _flat_lengths(query, key, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, *, name=VARLEN_ATTENTION):
    """Check the packed-layout kwargs (shapes only: no device sync) and return them for ``name``'s kernel."""
    import torch

    if cu_seq_lens_q is None or max_length_q is None:
        raise ValueError(
            f"attn_implementation={name!r} needs cu_seq_lens_q/k and max_length_q/k in the batch "
            "(model(**batch) passes them to every attention layer); this batch has none. Collate with "
            "FlatteningCollator(), or use attn_implementation='sdpa' for padded batches."
        )
    if query.shape[2] != key.shape[2]:
        raise ValueError(
            f"attn_implementation={name!r} is for training on packed batches: queries "
            f"({query.shape[2]}) and keys ({key.shape[2]}) differ in length, as when decoding with a cache. "
            "Generate with attn_implementation='sdpa' (model.set_attn_implementation('sdpa'))."
        )
    cu_seq_lens_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    max_length_k = max_length_q if max_length_k is None else max_length_k
    if cu_seq_lens_q.ndim != 1 or cu_seq_lens_k.ndim != 1:
        raise ValueError(
            f"cu_seq_lens_q/k must be 1-D (num_seqs + 1,), got shapes {tuple(cu_seq_lens_q.shape)} and "
            f"{tuple(cu_seq_lens_k.shape)}; a DataLoader batch_size above 1 around a collator that already "
            "returns one flat row stacks them. Let the collator see the whole minibatch."
        )
    lengths = []
    for value in (max_length_q, max_length_k):
        if isinstance(value, torch.Tensor):
            value = int(value.item())  # a tensor syncs once
        elif not isinstance(value, torch.SymInt):  # a symbolic int stays one: int() would specialise the graph
            value = int(value)
        lengths.append(value)
    cu_q = cu_seq_lens_q.to(device=query.device, dtype=torch.int32)
    cu_k = cu_seq_lens_k.to(device=query.device, dtype=torch.int32)
    return cu_q, cu_k, lengths[0], lengths[1]


def varlen_attention_forward(
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

    _refuse_unsupported(attention_mask, dropout, softcap, kwargs)
    cu_q, cu_k, max_q, max_k = _flat_lengths(query, key, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k)
    query, key, value = _autocast_inputs(query, key, value)
    kernel = _load_varlen_attn(query)
    # traced, the signature is read afresh (Dynamo warns on a cache wrapper); its answer is a constant of the graph
    params = _signature_parameters(kernel) if torch.compiler.is_compiling() else _kernel_parameters(kernel)
    is_causal = _is_causal(module, kwargs)
    heads, kv_heads, head_dim = query.shape[1], key.shape[1], query.shape[-1]
    # (b, h, s, d) -> (b * s, h, d): a view when b == 1 (head_dim stays contiguous, as the kernel needs).
    q, k, v = (_flat(x) for x in (query, key, value))
    options: dict[str, Any] = {}
    if kv_heads != heads:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        elif "window_size" not in params:  # PyTorch 2.10: repeat each kv head for its query group (as repeat_kv)
            k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
        # PyTorch 2.11 (window_size, no enable_gqa flag yet): its Flash kernel takes the fewer k/v heads
        # as they are; same output and gradients as repeated heads on an H200 (benchmarks/gpu/gpu_varlen_gqa_check.py)
    if scaling is not None:
        if "scale" in params:
            options["scale"] = scaling
        else:  # the kernel scales by 1/sqrt(head_dim); fold the difference into q
            q = q * (scaling * head_dim**0.5)
    window = _window(is_causal, sliding_window, max_k)
    if "window_size" in params:
        if _varlen_can_pick_cudnn():  # keep it on Flash (module docstring)
            window = tuple(max_k if side == -1 else side for side in window)
        options["window_size"] = window
    elif window not in ((-1, 0), (-1, -1)):
        raise ValueError(
            f"This PyTorch's varlen_attn has no window_size, and the model uses sliding_window={sliding_window} "
            "on sequences longer than it. Upgrade PyTorch, or use 'flash_attention_2' or 'flex_attention'."
        )
    else:
        options["is_causal"] = window == (-1, 0)
    out = kernel(q, k, v, cu_q, cu_k, max_q, max_k, **options)
    return out.view(query.shape[0], query.shape[2], heads, out.shape[-1]), None


def _is_causal(module, kwargs: dict) -> bool:
    """The layer's ``is_causal`` kwarg, else its module's (a decoder's self-attention: True)."""
    requested = kwargs.get("is_causal")
    return getattr(module, "is_causal", True) if requested is None else requested


def _flat(x):
    """(b, heads, s, d) -> (b * s, heads, d), the kernels' varlen layout: a view when b == 1.

    >>> import torch
    >>> _flat(torch.zeros(1, 4, 10, 8)).shape
    torch.Size([10, 4, 8])
    """
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])


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


def _autocast_inputs(query, key, value):
    """q, k, v in autocast's half dtype when autocast is on (Trainer ``bf16=True`` on float32 weights).

    Under autocast the rotary embedding leaves q and k in float32 (the float32 cos/sin of
    float32 hidden states) while v comes out of its projection in bf16; the kernel takes
    half precision only, so cast them as transformers' flash-attention path does.

    >>> import torch
    >>> q = torch.zeros(1, 1, 2, 4)
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     [x.dtype for x in _autocast_inputs(q, q, q.bfloat16())]
    [torch.bfloat16, torch.bfloat16, torch.bfloat16]
    >>> [x.dtype for x in _autocast_inputs(q, q, q)]  # no autocast: unchanged (the loader refuses float32)
    [torch.float32, torch.float32, torch.float32]
    """
    import torch

    device_type = query.device.type
    if not torch.is_autocast_enabled(device_type):
        return query, key, value
    target = torch.get_autocast_dtype(device_type)
    if target not in (torch.float16, torch.bfloat16):
        return query, key, value
    return tuple(x if x.dtype == target else x.to(target) for x in (query, key, value))


def _window(is_causal: bool, sliding_window: int | None, max_length: int) -> tuple[int, int]:
    """The kernel's (left, right) window: (-1, 0) causal, (w - 1, 0) causal sliding, (-1, -1) full.

    >>> _window(True, None, 100), _window(True, 16, 100), _window(True, 4096, 100), _window(False, None, 100)
    ((-1, 0), (15, 0), (-1, 0), (-1, -1))
    """
    if sliding_window is not None and max_length > sliding_window:
        left = int(sliding_window) - 1
        return (left, 0) if is_causal else (left, left)
    return (-1, 0) if is_causal else (-1, -1)
