"""The language-model loss from the last hidden states, a chunk of tokens at a time: never the full logits.

    hidden (N, H)  targets (N,)  weights (N,)          the N tokens that have a target, compacted
      for each chunk of r tokens (r <= 4,096, fewer at a large vocabulary):
        logits  = transform(hidden[c] @ W.T + b)        (r, V), the only (.., V) tensor alive
        loss   += sum(weights[c] * (logsumexp(logits) - logits[target]))
        grad    = weights[c] * (softmax(logits) - onehot(target))        (weighted_cross_entropy:
        dh[c]   = grad @ W;   dW += grad.T @ hidden[c]                    in the forward, if needed)

``weighted_cross_entropy`` computes the gradients in the forward (the weights are known then:
``1 / num_items_in_batch`` per token, or each example's share under the per-sequence loss), so the
backward only scales them: three matrix products per chunk, as the full-logit loss has, and no
recompute. ``token_log_probs`` returns each token's log-probability for losses that are not a
weighted sum (preference losses): it keeps one float per token and recomputes each chunk's logits
in its backward (four products). ``transform`` is what the model does after its projection:
a scale (Cohere, Granite, Falcon-H1) and a tanh soft cap (Gemma 2/3).

Three ways to run a chunk:
- On a GPU with Triton (the default there): the logits in the projection's dtype, as the full-logit loss
  has them before its ``logits.float()`` (bf16 under bf16 training); one Triton program per row reads them
  twice and writes the gradient over them, computing the softmax, the loss (and the log-probabilities'
  entropy, mean logit and top-1) in float32 (:mod:`._triton_rows`): the pass at its memory roofline.
- On a GPU without Triton: the same arithmetic as a ``torch.compile``d kernel pair (two passes over the
  chunk, and the statistics in eager float32 passes of their own).
- Elsewhere (eager): float32 logits (the projection accumulates and returns float32) and, where the
  projection is not float32, the gradient in a second buffer of its dtype (a third under a soft cap:
  its derivative); a few eager passes over the chunk.

Exactness: the weight's gradient accumulates in float32 over the chunks; in float32 the loss and
gradients equal the full-logit ones up to summation order (1e-6).
Memory: one chunk's logits (``chunk_rows``: 1 GiB of them, 2**29 elements in bf16 on the GPU path, 2**28 of
float32 on the eager one) and the weight's float32 gradient (``V x H``). Where the weight is not
float32 that accumulator is kept in blocks of 2**27 elements, converted to the weight's dtype one at a
time, so the conversion never holds the float32 accumulator and a converted copy at once. Each chunk reads and
writes the whole accumulator, so chunks and blocks are as large as that memory allows
(benchmarks/results/lm_head_breakdown_h100). (A full-logit
loss holds the logits, their float32 copy and its gradient: ~10 GB per copy at 16k tokens and a 152k
vocabulary.)
Cost: the same three products as the full-logit loss.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import _triton_rows

__all__ = ["MAX_CHUNK_ROWS", "LogitTransform", "chunk_rows", "token_log_probs", "weighted_cross_entropy"]

MAX_CHUNK_ROWS = 4096  # the most tokens whose logits are held at once
_CHUNK_BYTES = 1 << 30  # logits per chunk: 1 GiB (2**29 in bf16 on the compiled path, 2**28 in float32 eager)
_BLOCK_ELEMENTS = 1 << 27  # the weight's float32 gradient, converted to its dtype a block (512 MiB) at a time


@dataclass(frozen=True)
class LogitTransform:
    """What a model does to ``z = hidden @ W.T + b`` before its loss: ``cap * tanh(scale * z / cap)``, or ``scale * z``;
    then a sampling ``temperature`` divides the model's logits (after its softcap, as TRL's RL trainers divide them).

    >>> LogitTransform().apply(torch.tensor([2.0]))
    tensor([2.])
    >>> LogitTransform(scale=0.5, softcap=1.0).apply(torch.tensor([2.0]))
    tensor([0.7616])
    >>> LogitTransform(scale=0.5, softcap=1.0, temperature=2.0).apply(torch.tensor([2.0]))
    tensor([0.3808])
    """

    scale: float = 1.0
    softcap: float | None = None
    temperature: float = 1.0

    def apply(self, z: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            z = z * self.scale
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        if self.temperature != 1.0:
            z = z / self.temperature
        return z


def chunk_rows(vocab: int, max_rows: int = MAX_CHUNK_ROWS, element_size: int = 4) -> int:
    """Tokens per chunk: at most ``max_rows``, and about 1 GiB of logits of ``element_size`` bytes (a multiple of 128).

    >>> chunk_rows(32_000), chunk_rows(151_936), chunk_rows(248_320)
    (4096, 1664, 1024)
    >>> chunk_rows(151_936, element_size=2), chunk_rows(248_320, element_size=2)  # bf16 logits (compiled)
    (3456, 2048)
    """
    rows = _CHUNK_BYTES // element_size // max(1, vocab) // 128 * 128
    return max(128, min(max_rows, rows))


def _out_dtype_mm() -> bool:
    """Whether ``torch.mm(..., out_dtype=torch.float32)`` exists (CUDA, torch >= 2.8)."""
    from torch.torch_version import TorchVersion

    return TorchVersion(torch.__version__) >= "2.8"


def _project(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, float32: bool = True
) -> torch.Tensor:
    """``hidden @ weight.T + bias`` accumulated in float32, and returned in float32 (``float32``) or in
    the inputs' dtype, rounded once as ``nn.Linear`` returns it."""
    if not float32 or hidden.dtype == torch.float32:
        return hidden @ weight.t() if bias is None else torch.addmm(bias.to(hidden.dtype), hidden, weight.t())
    if hidden.is_cuda and _out_dtype_mm():
        out = torch.mm(hidden, weight.t(), out_dtype=torch.float32)
    else:
        out = hidden.float() @ weight.float().t()
    return out if bias is None else out.add_(bias.float())


def _accumulate(acc: torch.Tensor, grad_t: torch.Tensor, hidden: torch.Tensor) -> None:
    """``acc += grad_t @ hidden`` in float32, without rounding the product to the inputs' dtype first."""
    if grad_t.dtype == torch.float32:
        acc.addmm_(grad_t, hidden)
    elif grad_t.is_cuda and _out_dtype_mm():
        torch.addmm(acc, grad_t, hidden, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(grad_t.float(), hidden.float())


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype the projection runs in: autocast's where it is on (as ``nn.Linear`` would), else the hidden's."""
    device = hidden.device.type
    try:
        enabled = torch.is_autocast_enabled(device)
    except TypeError:  # torch < 2.4 takes no device
        enabled = torch.is_autocast_enabled() if device == "cuda" else torch.is_autocast_cpu_enabled()
    if not enabled:
        return hidden.dtype
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device)
    return torch.get_autocast_gpu_dtype() if device == "cuda" else torch.get_autocast_cpu_dtype()


def _chunk_eager(z, targets, weights, scale: float, softcap, out_dtype, want_grad: bool, temperature: float = 1.0):
    """One chunk: (sum(weights * (lse - chosen)), lse, chosen, and with ``want_grad`` the gradient at ``z``,
    ``weights * (softmax - onehot)`` through the transform, in ``out_dtype``). ``z`` float32 (r, V) is
    overwritten: one chunk-sized buffer, and a second under a soft cap (its derivative)."""
    logits = z.mul_(scale) if scale != 1.0 else z
    derivative = None
    if softcap:
        logits = logits.div_(softcap).tanh_()
        derivative = logits.square().neg_().add_(1) if want_grad else None  # d(c tanh(u / c)) / du
        logits = logits.mul_(softcap)
    if temperature != 1.0:
        logits = logits.div_(temperature)
    lse = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(1, targets[:, None])[:, 0]
    loss = (weights * (lse - chosen)).sum()
    if not want_grad:
        return loss, lse, chosen, None
    grad = logits.sub_(lse[:, None]).exp_()
    grad.scatter_add_(1, targets[:, None], grad.new_full((targets.shape[0], 1), -1.0))
    grad.mul_(weights[:, None] * (scale / temperature))
    if derivative is not None:
        grad.mul_(derivative)
    return loss, lse, chosen, grad.to(out_dtype)


def _chunk_in_place(z, targets, weights, scale: float, softcap, want_grad: bool, temperature: float = 1.0):
    """:func:`_chunk_eager`'s arithmetic in float32 from ``z`` of any dtype, written for ``torch.compile`` to
    fuse into two passes; with ``want_grad`` the gradient is written over ``z`` (no second chunk-sized buffer)."""
    logits = z.float() * scale
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    tempered = logits / temperature
    lse = torch.logsumexp(tempered, dim=-1)
    chosen = tempered.gather(1, targets[:, None])[:, 0]
    loss = (weights * (lse - chosen)).sum()
    if want_grad:
        onehot = torch.arange(logits.shape[1], device=logits.device)[None] == targets[:, None]
        grad = (torch.exp(tempered - lse[:, None]) - onehot.float()) * (weights[:, None] * (scale / temperature))
        if softcap:
            grad = grad * (1 - (logits / softcap) ** 2)
        z.copy_(grad)
    return loss, lse, chosen


@functools.lru_cache(maxsize=1)
def _compiled_chunk():
    """:func:`_chunk_in_place` wrapped by ``torch.compile`` once per process (dynamic row count), or None where
    ``torch.compile`` cannot wrap it; the compile itself runs at the first call."""
    try:
        return torch.compile(_chunk_in_place, dynamic=True)
    except Exception:  # noqa: BLE001 - no compiler on this platform: the eager chunk
        return None


def _compiled(compiled: bool, h: torch.Tensor, weight: torch.Tensor, transform):
    """The fused chunk where asked for: Triton's kernel (one program per row, at its memory roofline) where it runs
    for logits of ``h``'s dtype over ``weight``'s vocabulary under ``transform``, else the compiled chunk on CUDA,
    else None (the eager chunk)."""
    device = h.device
    if compiled and _triton_rows.usable(device, _triton_rows.variant(h.dtype, weight.shape[0], transform.softcap)):
        return _triton_rows.chunk
    return _compiled_chunk() if compiled and device.type == "cuda" else None


def _rows(weight: torch.Tensor, h: torch.Tensor, fn) -> int:
    """Tokens per chunk: the compiled chunk holds its logits in the projection's dtype, the eager one in float32."""
    return chunk_rows(weight.shape[0], element_size=4 if fn is None else h.element_size())


def _logits(h, w, bias, fn) -> torch.Tensor:
    """One chunk's logits: in the projection's dtype for the compiled chunk, float32 for the eager one."""
    return _project(h, w, bias, float32=fn is None)


def _chunk(z, targets, weights, transform: LogitTransform, out_dtype, want_grad: bool, fn):
    """(loss, lse, chosen, gradient at ``z`` in ``out_dtype`` or None); the compiled ``fn`` writes it over ``z``."""
    scale, softcap, temperature = float(transform.scale), transform.softcap, float(transform.temperature)
    if fn is None:
        return _chunk_eager(z, targets, weights, scale, softcap, out_dtype, want_grad, temperature)
    loss, lse, chosen = fn(z, targets, weights, scale, softcap, want_grad, temperature)
    return loss, lse, chosen, z if want_grad else None


class _Chunks:
    """The gradients of a chunked projection, filled one chunk at a time (float32 accumulators for W, b).

    Where the weight is not float32, its accumulator is kept in row blocks of about ``_BLOCK_ELEMENTS``
    (a multiple of 128 rows, so each block's slice of a chunk's gradient stays aligned for the GEMM), so
    that :meth:`result` converts and frees one block at a time."""

    def __init__(self, hidden, weight, bias) -> None:
        self.dh = torch.empty_like(hidden)
        vocab, width = weight.shape
        step = vocab if weight.dtype == torch.float32 else max(128, _BLOCK_ELEMENTS // max(1, width) // 128 * 128)
        self.blocks = [slice(s, min(s + step, vocab)) for s in range(0, vocab, max(1, step))] or [slice(0, 0)]
        self.dw = [torch.zeros((b.stop - b.start, width), dtype=torch.float32, device=weight.device) for b in self.blocks]
        self.db = None if bias is None else torch.zeros(vocab, dtype=torch.float32, device=weight.device)

    def add(self, grad: torch.Tensor, h: torch.Tensor, w: torch.Tensor, rows: slice) -> None:
        """One chunk's gradient at ``z`` ((r, V), in the projection's dtype): into dh[rows], dW and db."""
        if self.db is not None:
            self.db += grad.sum(0, dtype=torch.float32)
        self.dh[rows] = (grad @ w).to(self.dh.dtype)
        grad_t = grad.t()
        for block, acc in zip(self.blocks, self.dw):
            _accumulate(acc, grad_t[block], h[rows])

    def result(self, weight, bias):
        """dh, dW and db in their parameters' dtypes; dW's float32 blocks are freed as they are converted (at
        most one float32 block beside the converted ones, then two copies in the weight's dtype while they are
        joined: half the float32 accumulator's size in bf16)."""
        parts = []
        while self.dw:
            parts.append(self.dw.pop(0).to(weight.dtype))
        dw = parts[0] if len(parts) == 1 else torch.cat(parts)
        del parts
        return self.dh, dw, None if self.db is None else self.db.to(bias.dtype)


class _WeightedCrossEntropy(torch.autograd.Function):
    """sum(weights * cross_entropy) over chunks, its gradients made in the forward (see the module picture)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, weights, transform, dtype, needs_grad, compiled):
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grads = _Chunks(hidden, weight, bias) if needs_grad else None
            fn = _compiled(compiled, h, weight, transform)
            step = _rows(weight, h, fn)
            for start in range(0, h.shape[0], step):
                rows = slice(start, min(start + step, h.shape[0]))
                z = _logits(h[rows], w, bias, fn)
                part, _, _, grad = _chunk(z, targets[rows], weights[rows], transform, dtype, needs_grad, fn)
                loss += part
                if grads is not None:
                    del z
                    grads.add(grad, h, w, rows)
                    del grad
        ctx.save_for_backward(*(grads.result(weight, bias) if grads is not None else (None, None, None)))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        scaled = [None if g is None else g.mul_(grad_loss.to(g.dtype)) for g in ctx.saved_tensors]
        return (*scaled, None, None, None, None, None, None)


def weighted_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    weights: torch.Tensor,
    transform: LogitTransform = LogitTransform(),
    *,
    compiled: bool = True,
) -> torch.Tensor:
    """``sum_i weights[i] * cross_entropy(transform(hidden[i] @ weight.T + bias), targets[i])``, a float32 scalar.

    ``hidden`` (N, H) the tokens that have a target, ``targets`` int64 (N,), ``weights`` float32 (N,).
    Its gradients (to ``hidden``, ``weight``, ``bias``) are made in the forward, chunk by chunk; the
    backward may run once. ``compiled``: on CUDA, each chunk's softmax and gradient run as one
    ``torch.compile``d kernel pair (two passes over the chunk, its logits in the projection's dtype)
    instead of eager steps over float32 logits.

    >>> hidden, weight = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)), torch.eye(6, 4)
    >>> targets, weights = torch.tensor([0, 1, 2, 3, 5]), torch.full((5,), 0.2)
    >>> full = torch.nn.functional.cross_entropy(hidden @ weight.t(), targets)
    >>> bool(torch.allclose(weighted_cross_entropy(hidden, weight, None, targets, weights), full))
    True
    """
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    dtype = _compute_dtype(hidden)
    return _WeightedCrossEntropy.apply(
        hidden, weight, bias, targets, weights.float(), transform, dtype, needs_grad, compiled
    )


class _TokenLogProbs(torch.autograd.Function):
    """log p(target) per token over chunks, and each token's entropy (``stats``); the backward recomputes each
    chunk's logits. The entropy is an output with gradients only where ``entropy_grad`` (an entropy bonus)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, transform, dtype, compiled, stats, entropy_grad):
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            out = torch.empty(h.shape[0], dtype=torch.float32, device=hidden.device)
            lse = torch.empty_like(out)
            none = torch.zeros(h.shape[0], dtype=torch.float32, device=hidden.device)
            fn = _compiled(compiled, h, weight, transform)
            step = _rows(weight, h, fn)
            for start in range(0, h.shape[0], step):
                rows = slice(start, min(start + step, h.shape[0]))
                z = _logits(h[rows], w, bias, fn)
                if stats is not None and fn is _triton_rows.chunk:  # the statistics in the same pass as lse
                    found = _triton_rows.row_stats(z, targets[rows], transform.scale, transform.softcap,
                                                   transform.temperature)  # fmt: skip
                    _keep_stats(found, rows, stats, h.shape[0])
                    lse[rows], chosen = found["lse"], found["chosen"]
                else:
                    if stats is not None:  # before _chunk, which may overwrite z
                        _token_stats(transform.apply(z.float()), targets[rows], rows, stats, h.shape[0])
                    _, lse[rows], chosen, _ = _chunk(z, targets[rows], none[rows], transform, dtype, False, fn)
                out[rows] = chosen - lse[rows]
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.transform, ctx.dtype, ctx.compiled = transform, dtype, compiled
        # An output nothing differentiates (the entropy, unless a loss rewards it) reaches the backward as None, not as
        # zeros: zeros would send every chunk through the entropy's autograd path (3x the head's time at 248k).
        ctx.set_materialize_grads(False)
        entropy = stats["entropy"] if stats else out.new_zeros(out.shape)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out, grad_entropy):
        hidden, weight, bias, targets = ctx.saved_tensors
        if grad_out is None:  # only the entropy is differentiated
            grad_out = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)
            grads = _Chunks(hidden, weight, bias)
            fn = _compiled(ctx.compiled, h, weight, ctx.transform)
            step = _rows(weight, h, fn)
            if grad_entropy is not None:  # the autograd of a chunk's float32 logits: a few chunk-sized buffers
                step = chunk_rows(weight.shape[0], element_size=4 * _ENTROPY_BUFFERS)
            for start in range(0, h.shape[0], step):
                rows = slice(start, min(start + step, h.shape[0]))
                z = _logits(h[rows], w, bias, fn)
                if grad_entropy is not None:
                    grad = _log_prob_and_entropy_grad(z, targets[rows], grad_out[rows], grad_entropy[rows],
                                                      ctx.transform).to(ctx.dtype)  # fmt: skip
                else:  # d log p(t) / d logits = onehot(t) - softmax: the weighted gradient with weights -grad_out
                    upstream = -grad_out[rows].float()
                    *_, grad = _chunk(z, targets[rows], upstream, ctx.transform, ctx.dtype, True, fn)
                del z
                grads.add(grad, h, w, rows)
                del grad
        return (*grads.result(weight, bias), None, None, None, None, None, None)


_ENTROPY_BUFFERS = 6  # float32 (r, V) tensors alive in _log_prob_and_entropy_grad's autograd


def _log_prob_and_entropy_grad(z, targets, grad_log_prob, grad_entropy, transform: LogitTransform) -> torch.Tensor:
    """d(sum(grad_log_prob * log p(target) + grad_entropy * entropy)) / dz, float32 (r, V), through the transform."""
    with torch.enable_grad():
        leaf = z.detach().float().requires_grad_()
        log_p = torch.log_softmax(transform.apply(leaf), dim=-1)
        chosen = log_p.gather(1, targets[:, None])[:, 0]
        entropy = -(log_p.exp() * log_p).sum(-1)
        (grad,) = torch.autograd.grad((chosen, entropy), leaf, (grad_log_prob.float(), grad_entropy.float()))
    return grad


_STATS = ("entropy", "mean_logits", "is_top1", "log_sum_sq_probs")


def _token_stats(logits: torch.Tensor, targets: torch.Tensor, rows: slice, stats: dict, total: int) -> None:
    """Per-token entropy, mean logit, whether the target is the top token and ``log sum p**2`` (WPO's weights), into
    ``stats`` (float32 (N,) each)."""
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()  # once, for the entropy and the sum of squares
    found = {"entropy": -(p * log_p).sum(-1), "mean_logits": logits.mean(-1),
             "is_top1": (logits.argmax(-1) == targets).float(), "log_sum_sq_probs": (p * p).sum(-1).log()}  # fmt: skip
    _keep_stats(found, rows, stats, total)


def _keep_stats(found: dict, rows: slice, stats: dict, total: int) -> None:
    """A chunk's statistics into ``stats``' (N,) tensors, made at the first chunk."""
    if not stats:
        for name in _STATS:
            stats[name] = torch.empty(total, dtype=torch.float32, device=found[name].device)
    for name in _STATS:
        stats[name][rows] = found[name]


def token_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    transform: LogitTransform = LogitTransform(),
    *,
    compiled: bool = True,
    stats: dict | None = None,
    entropy_grad: bool = False,
) -> torch.Tensor:
    """float32 (N,): ``log_softmax(transform(hidden @ weight.T + bias))[i, targets[i]]``, a chunk at a time.

    ``stats``: a dict filled, in the same pass, with each token's ``entropy``, ``mean_logits`` (over the
    vocabulary) and ``is_top1`` (1.0 where the target is the most likely token), float32 (N,) each: what
    preference and RL trainers log. Without gradients, but for the ``entropy`` where ``entropy_grad`` (a loss that
    rewards it, such as TRL's entropy bonus: its backward then recomputes each chunk's softmax under autograd).

    >>> hidden, weight = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), torch.eye(6, 4)
    >>> full = torch.log_softmax(hidden @ weight.t(), -1)[torch.arange(3), torch.tensor([0, 1, 5])]
    >>> bool(torch.allclose(token_log_probs(hidden, weight, None, torch.tensor([0, 1, 5])), full))
    True
    """
    if entropy_grad and stats is None:
        raise ValueError("token_log_probs(entropy_grad=True) returns the entropies in stats: pass stats={}")
    out, entropy = _TokenLogProbs.apply(hidden, weight, bias, targets, transform, _compute_dtype(hidden), compiled,
                                        stats, bool(entropy_grad))  # fmt: skip
    if stats is not None:
        stats["entropy"] = entropy
    return out
