"""fuse_rope(model): the rotary embedding of queries and keys as one Triton kernel each way, where the model's family
computes the standard one.

transformers' attention layers call their modeling module's ``apply_rotary_pos_emb(q, k, cos, sin)``, which in eager
mode runs ``q * cos + rotate_half(q) * sin`` op by op: a slice, a negation, a concatenation, two products and a sum
for each of the queries and the keys, each a pass over (batch, heads, tokens, head dim), and their backwards. One
kernel reads the tensor and the angles once and writes the rotated tensor; its backward is the inverse rotation, the
same kernel. Under ``torch.compile`` Inductor fuses the same: this is for eager training, beside
:func:`~packing_collators.fused.fuse_rms_norms` and :func:`~packing_collators.fused.fuse_swiglu`.

Which models: each modeling module one of whose layers calls ``apply_rotary_pos_emb`` in its forward, where that
function gives ``x * cos + rotate_half(x) * sin`` on a random probe (angles whose halves differ, so a variant that
assumes them equal is told apart): measured on the function, so interleaved, multimodal and other variants keep
their own. The function is replaced in its module (that is where the layers look it up; Liger's patches do the same),
so every model of that family in the process gets it, with the same numbers off CUDA. A call the kernel does not take
(a partial rotary dimension, a ``cos`` that needs a gradient, mixed dtypes, other layouts, inside ``torch.compile``,
off CUDA, no Triton) runs the family's own function. Numerics: float32 inside, rounded once to the dtype (transformers
rounds each product and the sum). The kernel is checked once per device against torch (a warning and torch's ops
where it fails).

>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from transformers.models.llama import modeling_llama
>>> model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
...                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=32))
>>> ids = torch.randint(0, 32, (1, 6))
>>> expected = model(input_ids=ids).logits
>>> fuse_rope(model)  # the layers whose rotary embedding now runs on the kernel
2
>>> torch.equal(model(input_ids=ids).logits, expected)  # on the CPU: the family's own function, the same numbers
True
>>> unfuse_rope()  # every family back to its own function
1
"""

from __future__ import annotations

import functools
import inspect
import sys
import types

import torch

from .._kernel_check import DeviceCheck, same_as_float32

__all__ = ["fuse_rope", "rotate", "unfuse_rope"]

_NAME = "apply_rotary_pos_emb"
_ROWS = 16  # (batch, head, position) rows a program
_patched: dict[str, types.ModuleType] = {}  # module name -> module, where fuse_rope replaced the function


def fuse_rope(model: torch.nn.Module) -> int:
    """Make the rotary embedding of every layer of ``model`` whose family computes the standard one run on the
    kernel; returns how many layers call it. Idempotent."""
    layers = 0
    for module in model.modules():
        namespace = sys.modules.get(type(module).__module__)
        if namespace is None or not _calls_rope(module):
            continue
        function = getattr(namespace, _NAME, None)
        if getattr(function, "_packing_own", None) is None:
            if not callable(function) or not _computes_rope(function):
                continue
            setattr(namespace, _NAME, _fused(function))
            _patched[namespace.__name__] = namespace
        layers += 1
    return layers


def unfuse_rope() -> int:
    """Give every family :func:`fuse_rope` changed its own function back; returns how many."""
    restored = 0
    for namespace in _patched.values():
        function = getattr(namespace, _NAME, None)
        own = getattr(function, "_packing_own", None)
        if own is not None:
            setattr(namespace, _NAME, own)
            restored += 1
    _patched.clear()
    return restored


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x`` (batch, heads, tokens, head dim) and ``cos``/``sin`` (1 or batch,
    tokens, head dim), on the kernel (one each way, float32 inside); no fallback: :func:`fuse_rope`'s calls check
    that it runs."""
    return _Rotate.apply(x, cos, sin)


def usable(device: torch.device, variant: tuple | None = None) -> bool:
    """Whether the kernel runs for tensors on ``device``: CUDA, Triton installed, checked there once per variant
    (the dtype and head dimension: what Triton builds it for; against float32 torch ops and autograd on the same
    inputs, transposed queries as the layers pass them; a warning and torch's ops where it differs).

    >>> usable(torch.device("cpu"))
    False
    """
    return _trusted.usable(device, variant)


def _fused(own):
    @functools.wraps(own)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if _takes(q, k, cos, sin, args, kwargs):
            return rotate(q, cos, sin), rotate(k, cos, sin)
        return own(q, k, cos, sin, *args, **kwargs)

    apply_rotary_pos_emb._packing_own = own
    return apply_rotary_pos_emb


def _calls_rope(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward calls its module's ``apply_rotary_pos_emb`` (by name, as the layers do)."""
    code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
    return code is not None and _NAME in code.co_names


def _takes(q, k, cos, sin, args, kwargs) -> bool:
    """Whether the kernel computes this call exactly as the standard function would: (batch, heads, tokens, head dim)
    tensors of one dtype, full-width angles broadcast over the heads (``unsqueeze_dim`` 1), no gradient for them."""
    if (args, kwargs) not in (((), {}), ((1,), {}), ((), {"unsqueeze_dim": 1})):
        return False  # another unsqueeze_dim (another layout), or arguments the standard function has not
    tensors = (q, k, cos, sin)
    if not all(isinstance(t, torch.Tensor) for t in tensors) or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3:
        return False
    batch, _, tokens, width = q.shape
    return (
        k.shape[0] == batch and k.shape[2:] == (tokens, width) and width % 2 == 0
        and cos.shape == sin.shape and cos.shape[1:] == (tokens, width) and cos.shape[0] in (1, batch)
        and len({t.dtype for t in tensors}) == 1 and len({t.device for t in tensors}) == 1
        and not cos.requires_grad and not sin.requires_grad
        and not torch.compiler.is_compiling() and usable(q.device, (q.dtype, width))
    )  # fmt: skip


def _computes_rope(function) -> bool:
    """Whether ``function(q, k, cos, sin)`` gives the standard rotary embedding on a random float32 probe."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 1, 5, 8, generator=g)
    cos, sin = torch.randn(1, 5, 8, generator=g), torch.randn(1, 5, 8, generator=g)
    try:
        with torch.no_grad():
            got = function(q, k, cos, sin)
    except Exception:  # noqa: BLE001 - a function that cannot run on this probe is another kind: kept
        return False
    if not isinstance(got, tuple) or len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        return False
    return all(t.shape == x.shape and torch.allclose(t, _reference(x, cos, sin), rtol=1e-6, atol=1e-6)
               for t, x in zip(got, (q, k)))  # fmt: skip


def _reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos.unsqueeze(1) + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin.unsqueeze(1)


def _check(device: str, variant: tuple | None) -> bool:
    dtype, width = variant or (torch.float32, 64)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 3, width, generator=g).to(device, dtype).transpose(1, 2)  # (batch, heads, tokens, dim)
    cos, sin, grad = (torch.randn(*shape, generator=g).to(device, dtype)
                      for shape in ((1, 7, width), (1, 7, width), (2, 3, 7, width)))  # fmt: skip
    return same_as_float32(rotate, _reference, [x, cos, sin], grad, differentiate=[0], rtol=1e-5, grad_rtol=1e-5)


_trusted = DeviceCheck(_check, "fuse_rope's Triton kernel", "torch", "the rotary embedding runs torch's ops")


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    from . import _rope_kernels

    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty_like(x)  # the input's layout kept (the layers' transposed views stay so, as torch's ops keep them)
    batch, heads, tokens, width = x.shape
    rows = batch * heads * tokens
    half = width // 2
    _rope_kernels.rotate[(max(1, -(-rows // _ROWS)),)](
        x, cos, sin, y, rows, heads, tokens, *x.stride()[:3], *y.stride()[:3],
        cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1),
        HALF=half, HALF_P2=triton_next_power_of_2(half), ROWS=_ROWS, INVERSE=inverse,
    )  # fmt: skip
    return y


def triton_next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (Triton's block widths).

    >>> triton_next_power_of_2(64), triton_next_power_of_2(40), triton_next_power_of_2(1)
    (64, 64, 1)
    """
    return 1 << max(0, (n - 1).bit_length())


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, inverse=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _launch(grad, cos, sin, inverse=True), None, None
