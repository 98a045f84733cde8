"""Host (CPU) time of one attention call and of one training step, per attention path.

At 200M parameters and 16k tokens per step, packed FA4 trained slower than the same model with
``packing_varlen`` and than the oracle's flat rows under sdpa, though FA4's kernel is the fastest
(train_throughput.py). A model this small can be launch-bound: the host queues each step's kernels
barely faster than the GPU runs them, and any Python added per attention call shows up as GPU idle
time. This script measures that directly, on the GPU machine:

    calls   per attention path, the host time of one forward call and of one forward + backward
            (queued back to back, no sync; the GPU keeps up at --tokens 512) and the GPU time of
            the same call at --big-tokens (CUDA events): host above GPU means the call is host-bound
    paths   fa4_direct         flash_attn.cute.flash_attn_varlen_func on flat q/k/v
            flash_attention_4  transformers' attention function for FA4 (what the model calls)
            packing_varlen     this library's torch varlen backend
            sdpa               transformers' sdpa function on rows (no mask, causal)
    step    a --size model's forward + backward on a 16k-token batch (sft lengths, FlatteningCollator;
            sdpa on rows of the mean length): host seconds to queue the step, wall seconds of the
            step, and the functions with the most host time (cProfile) -> OUT/profile_<attn>.txt

    python benchmarks/gpu/attention_host_cost.py --out OUT
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import SIZES, build_model, command, lengths_of, markov_tokens, to_device  # noqa: E402


def attention_calls(tokens: int, heads: int, kv: int, dim: int, mean: int) -> dict:
    """Per path: a function that runs one attention forward on fresh leaf q/k/v and returns the output."""
    from transformers import AttentionInterface

    from packing_collators import register_varlen_attention
    from packing_collators.trainer import register_fa4_attention

    register_varlen_attention()
    register_fa4_attention()
    cuda = torch.device("cuda")
    lengths = [mean] * (tokens // mean)
    tokens = sum(lengths)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=cuda)
    flat = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": mean, "max_length_k": mean}

    def tensors(batch, seq):  # (batch, heads, seq, dim) as transformers passes them
        make = lambda h: torch.randn(batch, h, seq, dim, device=cuda, dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
        return make(heads), make(kv), make(kv)

    def module(attn):
        return SimpleNamespace(
            is_causal=True,
            layer_idx=0,
            training=True,
            num_key_value_groups=heads // kv,
            config=SimpleNamespace(_attn_implementation=attn),
        )

    def transformers_path(attn):
        fn = AttentionInterface._global_mapping[attn] if attn.startswith("packing_") else AttentionInterface()[attn]
        mod = module(attn)

        def call():
            q, k, v = tensors(1, tokens)
            return fn(mod, q, k, v, None, dropout=0.0, scaling=dim**-0.5, position_ids=None, **flat)[0]

        return call

    def fa4_direct():
        from flash_attn.cute import flash_attn_varlen_func

        def call():
            q, k, v = (t.transpose(1, 2).reshape(tokens, -1, dim) for t in tensors(1, tokens))
            out = flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mean, max_seqlen_k=mean, causal=True
            )
            return out[0] if isinstance(out, tuple) else out

        return call

    def sdpa():
        fn = AttentionInterface()["sdpa"]
        mod = module("sdpa")

        def call():
            q, k, v = tensors(len(lengths), mean)
            return fn(mod, q, k, v, None, dropout=0.0, scaling=dim**-0.5, is_causal=True)[0]

        return call

    return {
        "fa4_direct": fa4_direct(),
        "flash_attention_4": transformers_path("flash_attention_4"),
        "packing_fa4": transformers_path("packing_fa4"),
        "packing_varlen": transformers_path("packing_varlen"),
        "sdpa": sdpa(),
    }


def host_seconds(call, backward: bool, n: int) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(n):
        out = call()
        if backward:
            out.sum().backward()
    queued = time.perf_counter() - started
    torch.cuda.synchronize()
    return queued / n


def gpu_seconds(call, backward: bool, n: int) -> float:
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(n):
        out = call()
        if backward:
            out.sum().backward()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1e3 / n


def measure_calls(args) -> dict:
    _, _, heads, kv, _ = SIZES[args.size]
    dim = SIZES[args.size][0] // heads
    small = attention_calls(args.tokens, heads, kv, dim, mean=128)
    big = attention_calls(args.big_tokens, heads, kv, dim, mean=args.mean)
    results = {}
    for name in small:
        for backward in (False, True):
            for _ in range(3):  # warm-up (FA4 compiles its kernels for these shapes here)
                host_seconds(small[name], backward, 5), gpu_seconds(big[name], backward, 2)
            key = f"{name} {'fwd+bwd' if backward else 'fwd'}"
            results[key] = {
                "host_us": 1e6 * min(host_seconds(small[name], backward, 200) for _ in range(5)),
                "gpu_us_big": 1e6 * min(gpu_seconds(big[name], backward, 20) for _ in range(5)),
            }
            print(f"{key:28s} host {results[key]['host_us']:8.1f} us   gpu@{args.big_tokens} "
                  f"{results[key]['gpu_us_big']:8.1f} us", flush=True)  # fmt: skip
    return results


def measure_step(attn: str, args, out: Path) -> dict:
    from packing_collators import FlatteningCollator, warm_up_attention

    model = build_model(
        SimpleNamespace(size=args.size, vocab=32000, max_length=2048, seed=0), attn, "cuda", torch.bfloat16
    )
    lengths = lengths_of("sft", 4000, seed=0)
    take = np.flatnonzero(np.cumsum(lengths) <= args.big_tokens)
    examples = markov_tokens(lengths[take], 32000, seed=1)
    if attn == "sdpa":  # the oracle: rows of the mean length, same tokens
        mean = int(lengths[take].mean())
        ids = torch.as_tensor(np.concatenate(examples)[: len(take) * mean].reshape(len(take), mean))
        batch = {"input_ids": ids, "labels": ids.clone()}
    else:
        batch = FlatteningCollator()([{"input_ids": e} for e in examples])
        warm_up_attention(model, max_length=2048)
    batch = to_device(batch, "cuda")

    def step() -> float:
        started = time.perf_counter()
        model(**batch).loss.backward()
        queued = time.perf_counter() - started
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        return queued

    for _ in range(5):
        step()
    walls, queues = [], []
    for _ in range(10):
        started = time.perf_counter()
        queues.append(step())
        walls.append(time.perf_counter() - started)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(5):
        step()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    (out / f"profile_{attn}.txt").write_text(text.getvalue())
    result = {"host_queue_s": float(np.median(queues)), "step_wall_s": float(np.median(walls))}
    print(
        f"step {attn:18s} queue {result['host_queue_s'] * 1e3:6.1f} ms   wall {result['step_wall_s'] * 1e3:6.1f} ms",
        flush=True,
    )
    return result  # the model is freed on return; main empties the cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="200m", choices=sorted(SIZES))
    parser.add_argument("--tokens", type=int, default=512, help="host timing: small, so the GPU keeps up")
    parser.add_argument("--big-tokens", type=int, default=16384, help="GPU timing and the model step")
    parser.add_argument("--mean", type=int, default=296, help="sequence length of the GPU timing's batch")
    parser.add_argument("--attn", default="flash_attention_4,packing_fa4,packing_varlen,sdpa", help="model step paths")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"command": command(), "card": torch.cuda.get_device_name(), "calls": measure_calls(args)}
    results["step"] = {}
    for attn in args.attn.split(","):
        results["step"][attn] = measure_step(attn, args, args.out)
        torch.cuda.empty_cache()
    (args.out / "attention_host_cost.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
