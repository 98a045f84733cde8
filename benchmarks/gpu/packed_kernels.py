"""Which attention kernel runs a packed batch as fast as the oracle's dense rows? Kernel only, fwd + bwd.

oracle_gap.py found that at 1B parameters on short-example data, packed FA4 trails the uniform
oracle by ~1.5%, and that FA4 run on the oracle's own rows (flattened) trails by as much: the
gap is FA4's varlen kernel against cuDNN's dense one on short rows, not packing. This script
times one layer's attention (forward + backward, bf16, the 1B model's 32 query / 8 key-value
heads of 64) on ~16k tokens per distribution: GPU kernel time from torch.profiler, contenders
alternating, medians of --rounds:

    dense_cudnn           the oracle: rows of the mean length, sdpa pinned to cuDNN (enable_gqa)
    fa4_oracle_rows       the same rows flattened, through FA4's varlen kernel
    fa4_packed            the sampler's micro-batch (real lengths) through FA4's varlen kernel
    cudnn_ragged_packed   the same micro-batch through cuDNN's ragged path (aten._cudnn_attention_forward
                          with cum_seq_q/k, as nested tensors use it; k/v repeated to 32 heads)

and checks each packed kernel against a per-example reference run in float32 (max |diff| of the output
and of dq/dk/dv), so a fast kernel that mixes examples shows up as wrong, not as fast.

Usage (GPU): python benchmarks/gpu/packed_kernels.py --out benchmarks/results/packed_kernels
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from packing_collators import MultipackBatchSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import lengths_of  # noqa: E402

HEADS, KV_HEADS, DIM = 32, 8, 64


def fa4(q, k, v, cu, max_len):
    from flash_attn.cute import flash_attn_varlen_func

    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len, causal=True
    )
    return out[0] if isinstance(out, tuple) else out


def cudnn_ragged(q, k, v, cu, max_len):
    rep = HEADS // KV_HEADS
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, max_len, max_len, True, 0.0, True, False)[0]


def dense_cudnn(q, k, v):  # q (rows, heads, length, dim)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def reference(q, k, v, lengths):  # float32, one example at a time
    outs, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        qs, ks, vs = (t[s].float().transpose(0, 1) for t in (q, k, v))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True).transpose(0, 1))
        start += n
    return torch.cat(outs)


def inputs(total, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    make = lambda h: torch.randn(total, h, DIM, device=device, dtype=torch.bfloat16, generator=g)  # noqa: E731
    return (
        make(HEADS),
        make(KV_HEADS),
        make(KV_HEADS),
        torch.randn(total, HEADS, DIM, device=device, dtype=torch.bfloat16, generator=g),
    )


def fwd_bwd(fn, q, k, v, dout, *extra):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, *extra)
    out.backward(dout)
    return out, q.grad, k.grad, v.grad


def check(fn, lengths, device) -> dict:
    """Max |diff| against the per-example reference computed in float32 (float32 leaves, so its
    gradients stay float32), and the largest |reference| value of each, for scale."""
    lengths = [int(n) for n in lengths]
    q, k, v, dout = inputs(sum(lengths), device, 1)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)
    got = fwd_bwd(fn, q, k, v, dout, cu, max(lengths))
    want = fwd_bwd(lambda a, b, c: reference(a, b, c, lengths), q.float(), k.float(), v.float(), dout.float())
    result = {}
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        result[name] = float((g.detach().float() - w.detach()).abs().max())
        result[f"{name}_scale"] = float(w.detach().abs().max())
    return result


def kernel_ms(run, iters: int) -> float:
    """GPU kernel time of one call (ms), from torch.profiler: the host's own time is left out,
    since one layer's attention is short enough for Python to be slower than the GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time_total for e in kernels) / 1e3 / iters


def report(results: dict) -> str:
    """The run as a markdown table: kernel ms per 16k tokens and each against the dense oracle."""
    names = list(next(iter(results["runs"].values()))["ms_per_16k"])
    lines = [
        f"## Attention kernels on a packed batch vs the oracle's dense rows: {results['card']}",
        "",
        "One layer of the 1B model (32 query / 8 key-value heads of 64, bf16, causal), forward + backward, "
        "GPU kernel ms per 16,384 tokens (torch.profiler), median of the rounds; packed: the sampler's first "
        "micro-batch (examples in it below), oracle rows: whole rows of the data's mean length. Command: "
        f"`{results['command']}`",
        "",
        "| distribution | examples | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for dist, run in results["runs"].items():
        base = run["ms_per_16k"]["dense_cudnn"]
        cells = [f"{run['ms_per_16k'][n]:.3f} ({run['ms_per_16k'][n] / base:.0%})" for n in names]
        lines.append(f"| {dist} | {run['examples']} | " + " | ".join(cells) + " |")

    def shown(diff) -> str:  # "dq 0.0156 of 4.1": max |difference|, then the largest |reference| value
        if not isinstance(diff, dict):
            return diff
        return ", ".join(
            f"{k} {diff[k]:.3g}" + (f" of {diff[k + '_scale']:.3g}" if k + "_scale" in diff else "")
            for k in ("out", "dq", "dk", "dv")
        )

    lines += [
        "",
        "Max |difference| from a per-example reference in float32 (of the reference's largest |value| where "
        "recorded): on examples of 7, 130, 1, 300, 64, 129 tokens, and on each timed micro-batch:",
        "",
    ]
    for name, diff in results["exactness"].items():
        lines.append(f"- {name}, the 6 examples: {shown(diff)}")
    for dist, run in results["runs"].items():
        for name, diff in run.get("exactness", {}).items():
            lines.append(f"- {name}, {dist}'s micro-batch: {shown(diff)}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distributions", default="flan_like,orcamath_like,sft")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--examples", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=10, help="calls profiled per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown from --out's JSON")
    args = parser.parse_args()
    if args.report:
        (args.out / "packed_kernels.md").write_text(report(json.loads((args.out / "packed_kernels.json").read_text())))
        return
    device = torch.device("cuda")
    results = {"card": torch.cuda.get_device_name(), "command": "python " + " ".join(sys.argv), "runs": {}}
    contenders = {"fa4_packed": fa4, "cudnn_ragged_packed": cudnn_ragged}
    results["exactness"] = {}
    for name, fn in contenders.items():
        try:
            results["exactness"][name] = check(fn, [7, 130, 1, 300, 64, 129], device)
        except Exception as error:  # a kernel that cannot run this layout is reported, not timed
            results["exactness"][name] = f"{type(error).__name__}: {str(error)[:300]}"
    print(json.dumps(results["exactness"], indent=1), flush=True)
    for dist in args.distributions.split(","):
        lengths = np.minimum(lengths_of(dist, args.examples, seed=0), 2048)
        batch = next(iter(MultipackBatchSampler(lengths, args.tokens, seed=0, num_replicas=1, rank=0)))
        seg = [int(n) for n in lengths[batch]]
        mean = int(round(lengths.mean()))
        rows = sum(seg) // mean
        total = sum(seg)
        q, k, v, dout = inputs(total, device, 0)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(seg)]), dtype=torch.int32, device=device)
        cu_rows = torch.arange(0, rows * mean + 1, mean, dtype=torch.int32, device=device)
        n = rows * mean
        dense = [t[:n].view(rows, mean, t.shape[1], DIM).transpose(1, 2) for t in (q, k, v, dout)]
        plan = {
            "dense_cudnn": lambda: fwd_bwd(dense_cudnn, *dense[:3], dense[3]),
            "fa4_oracle_rows": lambda: fwd_bwd(fa4, q[:n], k[:n], v[:n], dout[:n], cu_rows, mean),
            "fa4_packed": lambda: fwd_bwd(fa4, q, k, v, dout, cu, max(seg)),
            "cudnn_ragged_packed": lambda: fwd_bwd(cudnn_ragged, q, k, v, dout, cu, max(seg)),
            "cudnn_ragged_oracle_rows": lambda: fwd_bwd(cudnn_ragged, q[:n], k[:n], v[:n], dout[:n], cu_rows, mean),
        }
        tokens = {
            "dense_cudnn": n,
            "fa4_oracle_rows": n,
            "fa4_packed": total,
            "cudnn_ragged_packed": total,
            "cudnn_ragged_oracle_rows": n,
        }
        live = {}
        for name, run in plan.items():
            try:
                run()
                torch.cuda.synchronize()
                live[name] = run
            except Exception as error:
                print(f"{dist} {name}: {type(error).__name__}: {str(error)[:200]}", flush=True)
        times = {name: [] for name in live}
        for _ in range(args.rounds):  # contenders alternate; each round profiles --repeats iterations
            for name, run in live.items():
                times[name].append(kernel_ms(run, args.repeats))
        per = {name: statistics.median(t) / tokens[name] * args.tokens for name, t in times.items()}
        exact = {}
        for name, fn in contenders.items():  # the timed micro-batch itself against the reference
            try:
                exact[name] = check(fn, seg, device)
            except Exception as error:
                exact[name] = f"{type(error).__name__}: {str(error)[:300]}"
        results["runs"][dist] = {
            "examples": len(seg),
            "tokens": total,
            "mean": mean,
            "ms_per_16k": per,
            "exactness": exact,
        }
        print(dist, len(seg), "examples", {k: round(v, 3) for k, v in per.items()}, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "packed_kernels.json").write_text(json.dumps(results, indent=1))
    (args.out / "packed_kernels.md").write_text(report(results))


if __name__ == "__main__":
    main()
