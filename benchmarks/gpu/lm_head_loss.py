"""The LM-head loss kernels side by side on one GPU: time, memory and exactness of forward + backward.

    python benchmarks/gpu/lm_head_loss.py --out DIR [--tokens 16384] [--vocabs 32000,151936,248320] [--hiddens 2048,4096]

One process, one (tokens, hidden, vocabulary) problem at a time: bf16 hidden states (tokens, hidden) and a
bf16 output embedding (vocabulary, hidden), random targets, the token-mean cross-entropy, forward and
backward. Kernels (those not installed are skipped and listed):

    full              F.linear -> logits.float() -> cross_entropy: the stock transformers loss
    chunked_eager     packing_collators.loss.weighted_cross_entropy(compiled=False): chunks, eager steps
    chunked_triton    the same, each chunk's softmax, loss and gradient as one Triton kernel (the default on CUDA)
    chunked_compiled  the same with that pass as torch.compile'd kernels (the default where Triton is missing)
    chunked_2x        chunked_triton with chunks of twice its logits: half the passes over the weight's float32
                      accumulator, at twice the logits' memory
    logprobs          packing_collators.loss.token_log_probs (recomputes in the backward; preference losses);
                      logprobs_compiled: without Triton
    logprobs_stats    the same with stats={} (each token's entropy, mean logit, top-1: GRPO's and DPO's forward);
                      logprobs_stats_compiled: without Triton (the statistics in eager float32 passes)
    liger             liger-kernel's fused linear cross-entropy (Triton)
    cce_exact         cut-cross-entropy's linear_cross_entropy, filter_eps=None (no gradient filtering)
    cce_default       the same with its default gradient filtering (filter_eps="high": inexact by design)
    trl               TRL 1.16's ChunkedLogProbFunction (its SFTTrainer's fused head)

Each kernel: 3 warm-up runs, then the median of --repeats timed runs (CUDA events around forward +
backward), the peak memory above the inputs (the hidden states, the weight, their gradients left
from the previous run freed), and the relative error of the loss and of both gradients against a
float32 reference computed a chunk at a time (the eager chunk, float32 throughout). Per problem also ``gemm_ms``: the three bare bf16 GEMMs any exact
head must do (logits = h W^T, dh = G W, dW = G^T h at full size), timed in the same run; per kernel
``ratio_vs_gemm`` (ms / gemm_ms), ``peak_extra_gib`` (the peak above the inputs less the two gradients
it returns), ``max_rel_error_vs_fp32`` (the largest of the three errors) and ``exact`` (no gradient filtering:
false for cce_default). Writes DIR/lm_head_loss.json and DIR/lm_head_loss.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

INEXACT = ("cce_default",)  # filters gradient terms below bf16's precision by design


def _kernels() -> dict:
    """name -> (hidden, weight, targets) -> scalar loss; only the importable ones."""
    from packing_collators.loss import token_log_probs, weighted_cross_entropy

    def weights_of(targets):
        return torch.full(targets.shape, 1.0 / targets.numel(), device=targets.device)

    def chunked(h, w, t):
        return weighted_cross_entropy(h, w, None, t, weights_of(t))

    def with_stats(h, w, t):  # what GRPO's and DPO's forwards ask: the entropy, mean logit and top-1 beside log p
        return -token_log_probs(h, w, None, t, stats={}).mean()

    kernels = {
        "full": lambda h, w, t: torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).float(), t),
        "chunked_eager": lambda h, w, t: weighted_cross_entropy(h, w, None, t, weights_of(t), compiled=False),
        "chunked_triton": chunked,
        "chunked_compiled": _without_triton(chunked),
        "chunked_2x": _twice_the_chunk(chunked),
        "logprobs": lambda h, w, t: -token_log_probs(h, w, None, t).mean(),
        "logprobs_compiled": _without_triton(lambda h, w, t: -token_log_probs(h, w, None, t).mean()),
        "logprobs_stats": with_stats,
        "logprobs_stats_compiled": _without_triton(with_stats),
    }
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        kernels["liger"] = lambda h, w, t: liger_fused_linear_cross_entropy(h, w, t, reduction="mean")
    except Exception as error:  # noqa: BLE001
        print(f"liger: not importable ({error})", flush=True)
    try:
        from cut_cross_entropy import linear_cross_entropy

        kernels["cce_exact"] = lambda h, w, t: linear_cross_entropy(h, w, t, filter_eps=None)
        kernels["cce_default"] = lambda h, w, t: linear_cross_entropy(h, w, t)
    except Exception as error:  # noqa: BLE001
        print(f"cut-cross-entropy: not importable ({error})", flush=True)
    try:
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction

        def trl(h, w, t):
            out = ChunkedLogProbFunction.apply(h, w, None, t, 1.0, 32768, None, 1.0, ("log_probs",))
            return -out[0].mean()

        kernels["trl"] = trl
    except Exception as error:  # noqa: BLE001
        print(f"trl: not importable ({error})", flush=True)
    return kernels


def _without_triton(fn):
    """``fn`` with the library's Triton rows turned off: each chunk's pass as the ``torch.compile``d kernel pair."""
    from packing_collators.loss import _triton_rows

    def run(h, w, t):
        saved = _triton_rows.usable
        _triton_rows.usable = lambda device: False
        try:
            return fn(h, w, t)
        finally:
            _triton_rows.usable = saved

    return run


def _twice_the_chunk(fn):
    """``fn`` run with chunks of twice the logits (the library's ``_CHUNK_BYTES``, patched for the call)."""
    from packing_collators.loss import _chunked

    def run(h, w, t):
        saved = _chunked._CHUNK_BYTES
        _chunked._CHUNK_BYTES = 2 * saved
        try:
            return fn(h, w, t)
        finally:
            _chunked._CHUNK_BYTES = saved

    return run


def median_ms(fn, repeats: int, warmup: int = 3) -> float:
    """The median time of ``fn()`` on the GPU (CUDA events around each call) after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _gemm_ms(h, w, repeats: int) -> float:
    """The median time of the three bare GEMMs of an exact head at full size (bf16 in, float32 accumulation)."""
    grad = torch.empty(h.shape[0], w.shape[0], dtype=h.dtype, device=h.device).normal_()

    def three():
        h.detach() @ w.detach().t(), grad @ w.detach(), grad.t() @ h.detach()

    ms = median_ms(three, repeats)
    del grad
    torch.cuda.empty_cache()
    return ms


def _reference(h, w, t):
    """float32 loss and gradients, a chunk at a time (exact to float32 summation order)."""
    from packing_collators.loss import weighted_cross_entropy

    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    loss = weighted_cross_entropy(h32, w32, None, t, torch.full(t.shape, 1.0 / t.numel(), device=t.device), compiled=False)
    loss.backward()
    return float(loss.detach()), h32.grad, w32.grad


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm().clamp(min=1e-30))


def _run(fn, h, w, t):
    h.grad = w.grad = None
    loss = fn(h, w, t)
    loss.backward()
    return loss


def _measure(name, fn, h, w, t, reference, repeats: int) -> dict:
    try:
        for _ in range(3):
            loss = _run(fn, h, w, t)
        torch.cuda.synchronize()
        h.grad = w.grad = None
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            h.grad = w.grad = None
            start.record()
            loss = _run(fn, h, w, t)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        peak = torch.cuda.max_memory_allocated() - base
    except Exception as error:  # noqa: BLE001 - a kernel that fails on this shape is reported, not fatal
        return {"kernel": name, "error": f"{type(error).__name__}: {str(error)[:200]}"}
    ref_loss, ref_h, ref_w = reference
    times.sort()
    returned = h.numel() * h.element_size() + w.numel() * w.element_size()  # the two gradients it hands back
    errors = [abs(float(loss) - ref_loss) / abs(ref_loss), _relative(h.grad, ref_h), _relative(w.grad, ref_w)]
    return {
        "kernel": name,
        "ms_median": times[len(times) // 2],
        "ms_min": times[0],
        "peak_gib_above_inputs": peak / (1 << 30),
        "peak_extra_gib": (peak - returned) / (1 << 30),
        "loss_relative_error": errors[0],
        "grad_hidden_relative_error": errors[1],
        "grad_weight_relative_error": errors[2],
        "max_rel_error_vs_fp32": max(errors),
        "exact": name not in INEXACT,
    }


def _problem(tokens: int, vocab: int, hidden: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = (torch.randn(tokens, hidden, device="cuda", generator=g) * 1.0).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    return h, w, t


def _table(rows: list[dict]) -> str:
    lines = [
        "| vocabulary | hidden | tokens | kernel | ms (median) | 3 GEMMs ms | x GEMMs | peak GiB above inputs | extra GiB "
        "| loss rel. error | dh rel. error | dW rel. error | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['vocab']} | {r['hidden']} | {r['tokens']} | {r['kernel']} |"
        if "error" in r:
            lines.append(f"{head} failed: {r['error']} | | | | | | | | |")
            continue
        lines.append(
            f"{head} {r['ms_median']:.2f} | {r['gemm_ms']:.2f} | {r['ratio_vs_gemm']:.3f} | {r['peak_gib_above_inputs']:.2f} | "
            f"{r['peak_extra_gib']:.2f} | {r['loss_relative_error']:.1e} | {r['grad_hidden_relative_error']:.1e} | "
            f"{r['grad_weight_relative_error']:.1e} | {r['exact']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocabs", default="32000,151936,248320")
    parser.add_argument("--hiddens", default="2048", help="hidden sizes, a comma list (issue #65: 2048,4096)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--only", default="", help="a comma list of kernels")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels = _kernels()
    if args.only:
        kernels = {k: v for k, v in kernels.items() if k in args.only.split(",")}
    rows = []
    problems = [(int(v), int(d)) for d in args.hiddens.split(",") for v in args.vocabs.split(",")]
    for vocab, hidden in problems:
        h, w, t = _problem(args.tokens, vocab, hidden)
        gemm_ms = _gemm_ms(h, w, args.repeats)
        reference = _reference(h, w, t)
        for name, fn in kernels.items():
            started = time.time()
            row = {"vocab": vocab, "tokens": args.tokens, "hidden": hidden, "gemm_ms": gemm_ms,
                   **_measure(name, fn, h, w, t, reference, args.repeats)}  # fmt: skip
            if "ms_median" in row:
                row["ratio_vs_gemm"] = row["ms_median"] / gemm_ms
            rows.append(row)
            print(json.dumps(row), f"({time.time() - started:.0f} s)", flush=True)
        del h, w, t, reference
        torch.cuda.empty_cache()
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    for name in ("lm_head_loss.json", "results.json"):  # results.json: the name issue #65 gives its rows
        (out / name).write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    (out / "lm_head_loss.md").write_text(f"{header}\n\n{_table(rows)}\n")
    print(_table(rows), flush=True)


if __name__ == "__main__":
    main()
