"""Each chunk's softmax, loss, gradient and token statistics as one Triton kernel: a program per token row.

    z (r, V) the chunk's logits, bf16 on the GPU path (the projection's output, as nn.Linear returns it)
    program i, row z[i]:
      pass 1: read z[i] once      x = transform(z[i]) in float32    online, per lane: max m, sum e^(x-m)
                                  (stats: sum e^(x-m) x for the entropy, sum x, the first largest x,
                                  sum e^(2(x-m)) for log sum p^2)
              lse[i] = log sum e^x;  chosen[i] = x[target];  loss[i] = weight[i] (lse[i] - chosen[i])
      pass 2 (gradient): read z[i] again, write over it  g = weight[i] (e^(x - lse) - onehot) dx/dz

Cost: two reads of the logits and one write, in their dtype, and nothing else: the memory roofline of the pass
the compiled chunk makes in several, and the statistics ride in pass 1 (the compiled path computed them in eager
float32 passes). Measured against both, by bandwidth: benchmarks/results/lm_head_h200 (``lm_head_rows.py``). Exactness: the same
float32 arithmetic as :func:`~packing_collators.loss._chunked._chunk_eager`, in another summation order
(float32 rounding, ~1e-6 relative); the tanh of a soft cap is computed from exp (a few float32 ulps).

Triton is imported when a kernel is first built; where it is missing, the tensors are not on CUDA, or the kernel
fails its first check on a device (``_trusted``, a :class:`DeviceCheck`, with a warning), the chunked loss uses its
compiled or eager chunk instead. Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is imported) runs them
on CPU tensors: the tests do.
"""

from __future__ import annotations

import importlib.util

import torch

from .._kernel_check import DeviceCheck, tolerance

__all__ = ["chunk", "row_stats", "usable", "variant"]

_BLOCK = 2048  # vocabulary entries a program reads at a time
_WARPS = 8  # 256 threads a program: 8 entries (16 bytes of bf16) per thread and read


def usable(device: torch.device, variant: tuple | None = None) -> bool:
    """Whether the Triton kernels run for tensors on ``device``: CUDA, with Triton installed, and the kernel built and
    checked there once per variant (:func:`variant`: the logits' dtype, the vocabulary and a soft cap, which Triton
    builds it for) against torch's softmax in float32 on the same logits (three rows over two vocabulary blocks and
    a short one), so that where it fails the chunked loss falls back to its compiled or eager chunk (with a warning)
    instead of failing or training on wrong numbers.

    >>> usable(torch.device("cpu"))
    False
    """
    return _trusted.usable(device, variant)


def variant(dtype: torch.dtype, vocab: int, softcap) -> tuple:
    """The kernel's variant for logits of ``dtype`` over ``vocab`` entries, with or without a soft cap: the check
    builds the kernel that training then runs.

    >>> variant(torch.bfloat16, 151_936, None)
    (torch.bfloat16, 151936, False)
    """
    return dtype, int(vocab), bool(softcap)


def _check(device: str, variant: tuple | None) -> bool:
    dtype, vocab, capped = variant or (torch.float32, 2 * _BLOCK + 5, True)
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(3, vocab, generator=g) * 4).to(device, dtype)
    targets = torch.tensor([0, min(_BLOCK, vocab - 1), vocab - 1]).to(device)
    weights = torch.full((3,), 0.5, device=device)
    softcap = 30.0 if capped else None
    logits = z.float()  # torch's numbers in float32 on the same logits
    capped_logits = torch.tanh(logits / 30.0) * 30.0 if capped else logits
    expected = (torch.softmax(capped_logits, -1) - torch.nn.functional.one_hot(targets, vocab)) * 0.5
    if capped:
        expected = expected * (1 - (capped_logits / 30.0) ** 2)
    grad = z.clone()
    _, lse = chunk(grad, targets, weights, 1.0, softcap, True)[:2]
    same = torch.allclose(lse, torch.logsumexp(capped_logits, -1), rtol=1e-5, atol=1e-5)
    return same and torch.allclose(grad.float(), expected, rtol=tolerance(dtype, 1e-4), atol=1e-6)


_trusted = DeviceCheck(_check, "the chunked loss's Triton kernel", "torch's softmax",
                       "the loss runs its torch.compile'd chunk")


def _launch(z, targets, weights, scale: float, softcap, temperature: float, want_grad: bool, stats: bool):
    rows_count, vocab = z.shape
    assert z.stride(1) == 1 and targets.shape == (rows_count,), "the chunk's rows must be contiguous"
    out = _outputs(7 if stats else 3, rows_count, z.device)
    if weights is None:
        weights = out[2]  # any float32 (r,): the loss it weights is not read
    if rows_count:  # imported here: Triton is optional, and its jit reads TRITON_INTERPRET when the module loads
        importlib.import_module("packing_collators.loss._triton_kernels").rows[(rows_count,)](
            z, z.stride(0), targets.contiguous(), weights.contiguous(), out[0], out[1], out[2],
            *(out[3:] if stats else (out[0], out[0], out[0], out[0])), float(scale), float(softcap or 1.0),
            1.0 / float(temperature), vocab=vocab, SOFTCAP=bool(softcap), WANT_GRAD=want_grad, STATS=stats, BLOCK=_BLOCK,
            num_warps=_WARPS,
        )  # fmt: skip
    return out


def _outputs(count: int, rows: int, device) -> torch.Tensor:
    """``count`` float32 rows of ``rows`` outputs, each starting 16 bytes aligned whatever ``rows`` is: Triton builds
    a kernel variant per alignment of each pointer it is passed, so unaligned rows (a chunk of an odd row count, the
    check's three rows) would build another kernel.

    >>> out = _outputs(3, 5, "cpu")
    >>> out.shape, [row.data_ptr() % 16 for row in out]
    (torch.Size([3, 5]), [0, 0, 0])
    """
    return torch.empty((count, -(-rows // 4) * 4), dtype=torch.float32, device=device)[:, :rows]


def chunk(z, targets, weights, scale: float, softcap, want_grad: bool, temperature: float = 1.0):
    """:func:`~packing_collators.loss._chunked._chunk_in_place` in one kernel: (sum(weights * (lse - chosen)), lse,
    chosen), and with ``want_grad`` ``weights * (softmax - onehot)`` through the transform written over ``z``."""
    out = _launch(z, targets, weights, scale, softcap, temperature, want_grad, stats=False)
    return out[2].sum(), out[0], out[1]


def row_stats(z, targets, scale: float, softcap, temperature: float = 1.0) -> dict:
    """One pass over ``z`` (r, V), left as it is: each row's ``lse``, ``chosen`` (the target's transformed logit),
    ``entropy``, ``mean_logits``, ``is_top1`` and ``log_sum_sq_probs``, float32 (r,) each, of the transformed logits."""
    out = _launch(z, targets, None, scale, softcap, temperature, want_grad=False, stats=True)
    return dict(zip(("lse", "chosen", "loss", "entropy", "mean_logits", "is_top1", "log_sum_sq_probs"), out))
