"""Whether FlashAttention-4's compiles overlap in threads (issue #65: the first step on a fresh machine).

Compiles the forward and backward of ``--variants`` FA4 kernel variants (head widths 64, 128, 96, ...: each its own
compile) on empty caches, one after another or each in a thread of its own, and prints the wall time as JSON, with
the error of each variant that failed (``failed``). If threads overlap the compiles (CuTe DSL's MLIR and ptxas passes
free the GIL), a warm-up could compile while the memory check runs; if not, only other processes can.

What it found: benchmarks/results/first_step_later_runs_h200/README.md.

    python3 benchmarks/gpu/fa4_compile_threads.py --mode serial  --variants 3   # a process each: nothing shared
    python3 benchmarks/gpu/fa4_compile_threads.py --mode threads --variants 3
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time

WIDTHS = (64, 128, 96, 192)


def compile_variant(width: int) -> float:
    import torch
    from flash_attn.cute import flash_attn_varlen_func

    started = time.perf_counter()
    lengths = [700, 300]
    cu = torch.tensor([0, 700, 1000], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(1000, heads, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for heads in (8, 2, 2))  # fmt: skip
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths),
                                 max_seqlen_k=max(lengths), causal=True)  # fmt: skip
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("serial", "threads"), required=True)
    parser.add_argument("--variants", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", tempfile.mkdtemp())
    import torch
    import flash_attn.cute  # noqa: F401  (imported before the clock: both modes pay it alike)

    torch.zeros(1, device="cuda")
    widths = WIDTHS[: args.variants]
    started, each, failed = time.perf_counter(), {}, {}

    def run(width: int) -> None:
        try:
            each[width] = compile_variant(width)
        except Exception as error:  # noqa: BLE001  (what failed is the measurement)
            failed[width] = f"{type(error).__name__}: {error}"[:300]

    if args.mode == "serial":
        for width in widths:
            run(width)
    else:
        threads = [threading.Thread(target=run, args=(width,)) for width in widths]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(json.dumps({"mode": args.mode, "variants": len(widths), "wall_s": round(time.perf_counter() - started, 2),
                      "each_s": {str(k): round(v, 2) for k, v in each.items()},
                      "failed": {str(k): v for k, v in failed.items()},
                      "device": torch.cuda.get_device_name()}))  # fmt: skip


if __name__ == "__main__":
    main()
