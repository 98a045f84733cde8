"""GPU check: packing_varlen hands grouped-query k/v to the Flash kernel unrepeated, exactly.

PyTorch 2.11's ``varlen_attn`` has no ``enable_gqa`` flag, but its Flash kernel accepts fewer
k/v heads than query heads. ``varlen_attention_forward`` therefore passes k/v as they are
(no ``repeat_interleave`` copy per layer, no gradient reduction). This compares it, on a
packed batch, with the same call on k/v repeated to the query heads (no GQA at all), output
and gradients, and times both (forward + backward, median of CUDA-event spans).

Usage (GPU): python benchmarks/gpu/gpu_varlen_gqa_check.py --out benchmarks/results/gpu_varlen_gqa
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
from pathlib import Path

import torch

from packing_collators import varlen_attention_forward

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import timed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    from torch.nn.attention.varlen import varlen_attn

    torch.manual_seed(0)
    lengths = [1000, 100, 1900, 3000, 37, 2000, 1200, 7147]  # 16,384 tokens
    heads, kv_heads, d = 16, 4, 64
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(1, heads, total, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, kv_heads, total, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, kv_heads, total, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(1, total, heads, d, device="cuda", dtype=torch.bfloat16)
    kwargs = dict(
        scaling=d**-0.5, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths)
    )

    def native():
        return varlen_attention_forward(None, q, k, v, None, **kwargs)[0]

    def repeated():
        group = heads // kv_heads
        return varlen_attention_forward(
            None, q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), None, **kwargs
        )[0]

    results = {}
    for name, fn in (("repeated", repeated), ("native", native)):
        for t in (q, k, v):
            t.grad = None
        out = fn()
        out.backward(grad)
        results[name] = [out.detach().float()] + [t.grad.float() for t in (q, k, v)]
    diffs = [float((a - b).abs().max()) for a, b in zip(results["native"], results["repeated"])]
    scales = [float(b.abs().max()) for b in results["repeated"]]

    times = {}
    for _ in range(2):  # alternate
        for name, fn in (("repeated", repeated), ("native", native)):
            times.setdefault(name, []).append(timed(lambda: fn().backward(grad), args.repeats, warmup=5))
    report = {
        "card": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "varlen_attn_signature": str(inspect.signature(varlen_attn)),
        "heads": heads,
        "kv_heads": kv_heads,
        "lengths": lengths,
        "max_abs_diff_out_dq_dk_dv": diffs,
        "max_abs_reference_out_dq_dk_dv": scales,
        "ms_fwd_bwd_median": {name: statistics.median(t) for name, t in times.items()},
        "command": "python " + " ".join(sys.argv),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_varlen_gqa_check.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
