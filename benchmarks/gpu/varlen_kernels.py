"""Packed (varlen) attention kernels on one GPU: PyTorch's Flash varlen vs cuDNN's ragged SDPA.

For a packed micro-batch (lengths from a standard distribution, --tokens tokens, GQA heads as
in the 200M/1B configs) it times forward + backward of:

    flash_varlen      torch.nn.attention.varlen.varlen_attn (what packing_varlen calls)
    cudnn_ragged      aten._cudnn_attention_forward with cu_seq_lens (cuDNN's THD layout)
    cudnn_ragged_rep  the same with k/v heads repeated for the query groups
    dense_cudnn_mean  dense sdpa (cuDNN) on rows of the mean length: the oracle's kernel

and checks each packed kernel's output and gradients against flash_varlen.

Usage (GPU): python benchmarks/gpu/varlen_kernels.py --out benchmarks/results/varlen_kernels
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import lengths_of, timed  # noqa: E402


def cudnn_ragged(q, k, v, cu, max_len, scale):
    out = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu, cu, max_len, max_len, True, 0.0, True, False, scale=scale
    )
    return out[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distributions", default="flan_like,orcamath_like,sft")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", default="16/4,32/8", help="query/kv heads, comma separated")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from torch.nn.attention.varlen import varlen_attn

    device, dtype = torch.device("cuda"), torch.bfloat16
    results = []
    for dist in args.distributions.split(","):
        lengths = np.minimum(lengths_of(dist, 20000, seed=0), 2048)
        order = np.random.default_rng(0).permutation(len(lengths))  # a random micro-batch, as the sampler makes
        seg = lengths[order][: int(np.searchsorted(np.cumsum(lengths[order]), args.tokens, side="right"))]
        total = int(seg.sum())
        cu = torch.tensor(np.concatenate([[0], np.cumsum(seg)]), dtype=torch.int32, device=device)
        max_len = int(seg.max())
        mean = int(round(lengths.mean()))
        for spec in args.heads.split(","):
            h, kvh = (int(x) for x in spec.split("/"))
            d = args.head_dim
            scale = d**-0.5
            torch.manual_seed(0)
            q = torch.randn(total, h, d, device=device, dtype=dtype, requires_grad=True)
            k = torch.randn(total, kvh, d, device=device, dtype=dtype, requires_grad=True)
            v = torch.randn(total, kvh, d, device=device, dtype=dtype, requires_grad=True)
            grad = torch.randn(total, h, d, device=device, dtype=dtype)
            group = h // kvh

            params = inspect.signature(varlen_attn).parameters
            options = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
            native_gqa = "enable_gqa" in params
            if kvh != h and native_gqa:
                options["enable_gqa"] = True
            if "scale" in params:
                options["scale"] = scale

            def run_flash():  # as packing_varlen calls it: k/v repeated where the kernel has no enable_gqa
                kr, vr = (k, v) if native_gqa or kvh == h else (x.repeat_interleave(group, dim=1) for x in (k, v))
                return varlen_attn(q, kr, vr, cu, cu, max_len, max_len, **options)

            def run_cudnn():
                return cudnn_ragged(q, k, v, cu, max_len, scale)

            def run_cudnn_rep():
                kr, vr = (x.repeat_interleave(group, dim=1) for x in (k, v))
                return cudnn_ragged(q, kr, vr, cu, max_len, scale)

            rows_n = total // mean
            qd = torch.randn(rows_n, h, mean, d, device=device, dtype=dtype, requires_grad=True)
            kd = torch.randn(rows_n, kvh, mean, d, device=device, dtype=dtype, requires_grad=True)
            vd = torch.randn(rows_n, kvh, mean, d, device=device, dtype=dtype, requires_grad=True)
            gd = torch.randn(rows_n, h, mean, d, device=device, dtype=dtype)

            def run_dense():
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(
                        qd, kd, vd, is_causal=True, enable_gqa=kvh != h
                    )

            reference = None
            for name, fn, g in (
                ("flash_varlen", run_flash, grad),
                ("cudnn_ragged", run_cudnn, grad),
                ("cudnn_ragged_rep", run_cudnn_rep, grad),
                ("dense_cudnn_mean", run_dense, gd),
            ):
                row = {
                    "distribution": dist,
                    "heads": spec,
                    "kernel": name,
                    "tokens": total,
                    "segments": len(seg),
                    "max_len": max_len,
                }
                try:
                    for t in (q, k, v, qd, kd, vd):
                        t.grad = None
                    out = fn()
                    out.backward(g)
                    torch.cuda.synchronize()
                    if name == "flash_varlen":
                        reference = [out.detach().float()] + [t.grad.float() for t in (q, k, v)]
                    elif name != "dense_cudnn_mean" and reference is not None:
                        mine = [out.detach().float()] + [t.grad.float() for t in (q, k, v)]
                        row["max_abs_diff_vs_flash"] = [float((a - b).abs().max()) for a, b in zip(mine, reference)]
                    row["grad_fn"] = type(out.grad_fn).__name__ if out.grad_fn is not None else None
                    row["ms_fwd_bwd"] = timed(lambda: fn().backward(g), args.repeats)
                    row["ms_fwd"] = timed(lambda: fn().detach(), args.repeats)
                except Exception as error:  # noqa: BLE001 - a probe: record why a kernel cannot run
                    row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                results.append(row)
                print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "varlen_kernels.json").write_text(
        json.dumps(
            {
                "card": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "cudnn": torch.backends.cudnn.version(),
                "command": "python " + " ".join(sys.argv),
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
