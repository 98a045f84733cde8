"""The chunked loss's per-chunk pass alone on one GPU: the Triton rows against the compiled pair, by bandwidth.

    python benchmarks/gpu/lm_head_rows.py --out DIR [--vocabs 151936,248320] [--blocks 1024,2048,4096] [--warps 4,8,16]

One chunk of bf16 logits as the chunked loss holds it (1 GiB: 2,048 rows at 248k, 3,456 at 152k), random targets
and weights. Timed (CUDA events, median of --repeats after 3 warm-ups):
    triton_grad_B_W   packing_collators.loss._triton_rows.chunk with the gradient (2 reads + 1 write of the chunk),
                      for each vocabulary block B and warp count W
    triton_stats_B_W  row_stats: lse, chosen, entropy, mean logit, top-1 (1 read)
    compiled_grad     the torch.compile'd pair (_chunked._compiled_chunk), the default where Triton is missing
    eager_stats       _chunked._token_stats on the float32 transformed logits, as token_log_probs did it
Per row ``ms``, ``gb_per_s`` (the bytes the pass must move over its time) and ``vs_roofline`` against the device's
copy bandwidth measured in the same run (a chunk-sized device-to-device copy: 2 x bytes). Writes DIR/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_head_loss import median_ms as _time  # noqa: E402  (the same timing, one home)


def main() -> None:
    from packing_collators.loss import _chunked, _triton_rows

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocabs", default="151936,248320")
    parser.add_argument("--blocks", default="1024,2048,4096")
    parser.add_argument("--warps", default="4,8,16")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rows_out = []
    for vocab in (int(v) for v in args.vocabs.split(",")):
        r = _chunked.chunk_rows(vocab, element_size=2)
        g = torch.Generator(device="cuda").manual_seed(0)
        z0 = (torch.randn(r, vocab, device="cuda", generator=g) * 3).bfloat16()
        targets = torch.randint(0, vocab, (r,), device="cuda", generator=g)
        weights = torch.full((r,), 1.0 / r, device="cuda")
        z, other = z0.clone(), torch.empty_like(z0)
        nbytes = z0.numel() * z0.element_size()
        copy_ms = _time(lambda: other.copy_(z0), args.repeats)
        bandwidth = 2 * nbytes / copy_ms / 1e6  # GB/s
        reference = _chunked._chunk_eager(z0.float(), targets, weights, 1.0, None, torch.bfloat16, True)

        def row(name, ms, moved, **extra):
            rows_out.append({"vocab": vocab, "rows": r, "kernel": name, "ms": ms, "gb_per_s": moved / ms / 1e6,
                             "vs_roofline": moved / ms / 1e6 / bandwidth, "copy_gb_per_s": bandwidth, **extra})  # fmt: skip
            print(json.dumps(rows_out[-1]), flush=True)

        for block in (int(b) for b in args.blocks.split(",")):
            for warps in (int(w) for w in args.warps.split(",")):
                _triton_rows._BLOCK, _triton_rows._WARPS = block, warps
                ms = _time(lambda: _triton_rows.chunk(z.copy_(z0), targets, weights, 1.0, None, True), args.repeats)
                ms -= copy_ms  # the refill of z each call is a chunk copy
                error = float((z.float() - reference[3].float()).abs().max())
                row(f"triton_grad_{block}_{warps}", ms, 3 * nbytes, max_abs_grad_diff_vs_eager=error)
                ms = _time(lambda: _triton_rows.row_stats(z0, targets, 1.0, None), args.repeats)
                row(f"triton_stats_{block}_{warps}", ms, nbytes)
        _triton_rows._BLOCK, _triton_rows._WARPS = 2048, 8
        fn = _chunked._compiled_chunk()
        ms = _time(lambda: fn(z.copy_(z0), targets, weights, 1.0, None, True, 1.0), args.repeats) - copy_ms
        row("compiled_grad", ms, 3 * nbytes)
        stats: dict = {}
        ms = _time(lambda: _chunked._token_stats(z0.float(), targets, slice(None), stats, r), args.repeats)
        row("eager_stats", ms, nbytes)
        del z, z0, other, reference
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    (out / "results.json").write_text(json.dumps({"header": header, "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
