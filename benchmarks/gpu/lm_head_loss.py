"""The LM-head loss kernels side by side on one GPU: time, memory and exactness of forward + backward.

    python benchmarks/gpu/lm_head_loss.py --out DIR [--tokens 16384] [--vocabs 32000,151936,248320]

One process, one (tokens, hidden, vocabulary) problem at a time: bf16 hidden states (tokens, 2048) and a
bf16 output embedding (vocabulary, 2048), random targets, the token-mean cross-entropy, forward and
backward. Kernels (those not installed are skipped and listed):

    full              F.linear -> logits.float() -> cross_entropy: the stock transformers loss
    chunked_eager     packing_collators.loss.weighted_cross_entropy(compiled=False): chunks, eager steps
    chunked_compiled  the same, each chunk's softmax and gradient as torch.compile'd kernels (the default)
    logprobs          packing_collators.loss.token_log_probs (recomputes in the backward; preference losses)
    liger             liger-kernel's fused linear cross-entropy (Triton)
    cce_exact         cut-cross-entropy's linear_cross_entropy, filter_eps=None (no gradient filtering)
    cce_default       the same with its default gradient filtering (filter_eps="high": inexact by design)
    trl               TRL 1.16's ChunkedLogProbFunction (its SFTTrainer's fused head)

Each kernel: 3 warm-up runs, then the median of --repeats timed runs (CUDA events around forward +
backward), the peak memory above the inputs (the hidden states, the weight, their gradients left
from the previous run freed), and the relative error of the loss and of both gradients against a
float32 reference computed a chunk at a time. Writes DIR/lm_head_loss.json and DIR/lm_head_loss.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HIDDEN = 2048


def _kernels() -> dict:
    """name -> (hidden, weight, targets) -> scalar loss; only the importable ones."""
    from packing_collators.loss import token_log_probs, weighted_cross_entropy

    def weights_of(targets):
        return torch.full(targets.shape, 1.0 / targets.numel(), device=targets.device)

    kernels = {
        "full": lambda h, w, t: torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).float(), t),
        "chunked_eager": lambda h, w, t: weighted_cross_entropy(h, w, None, t, weights_of(t), compiled=False),
        "chunked_compiled": lambda h, w, t: weighted_cross_entropy(h, w, None, t, weights_of(t), compiled=True),
        "logprobs": lambda h, w, t: -token_log_probs(h, w, None, t).mean(),
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


def _reference(h, w, t):
    """float32 loss and gradients, a chunk at a time (exact to float32 summation order)."""
    from packing_collators.loss import weighted_cross_entropy

    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    loss = weighted_cross_entropy(h32, w32, None, t, torch.full(t.shape, 1.0 / t.numel(), device=t.device))
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
    return {
        "kernel": name,
        "ms_median": times[len(times) // 2],
        "ms_min": times[0],
        "peak_gib_above_inputs": peak / (1 << 30),
        "loss_relative_error": abs(float(loss) - ref_loss) / abs(ref_loss),
        "grad_hidden_relative_error": _relative(h.grad, ref_h),
        "grad_weight_relative_error": _relative(w.grad, ref_w),
    }


def _problem(tokens: int, vocab: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = (torch.randn(tokens, HIDDEN, device="cuda", generator=g) * 1.0).bfloat16().requires_grad_()
    w = (torch.randn(vocab, HIDDEN, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    return h, w, t


def _table(rows: list[dict]) -> str:
    lines = [
        "| vocabulary | tokens | kernel | ms (median) | peak GiB above inputs | loss rel. error | dh rel. error | dW rel. error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['vocab']} | {r['tokens']} | {r['kernel']} | failed: {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['vocab']} | {r['tokens']} | {r['kernel']} | {r['ms_median']:.2f} | {r['peak_gib_above_inputs']:.2f} | "
            f"{r['loss_relative_error']:.1e} | {r['grad_hidden_relative_error']:.1e} | {r['grad_weight_relative_error']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocabs", default="32000,151936,248320")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--only", default="", help="a comma list of kernels")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels = _kernels()
    if args.only:
        kernels = {k: v for k, v in kernels.items() if k in args.only.split(",")}
    rows = []
    for vocab in (int(v) for v in args.vocabs.split(",")):
        h, w, t = _problem(args.tokens, vocab)
        reference = _reference(h, w, t)
        for name, fn in kernels.items():
            started = time.time()
            row = {"vocab": vocab, "tokens": args.tokens, "hidden": HIDDEN, **_measure(name, fn, h, w, t, reference, args.repeats)}
            rows.append(row)
            print(json.dumps(row), f"({time.time() - started:.0f} s)", flush=True)
        del h, w, t, reference
        torch.cuda.empty_cache()
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    (out / "lm_head_loss.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    (out / "lm_head_loss.md").write_text(f"{header}\n\n{_table(rows)}\n")
    print(_table(rows), flush=True)


if __name__ == "__main__":
    main()
