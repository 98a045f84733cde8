"""Where packed training loses to the uniform oracle: attention work, kernel by kernel.

train_throughput.py measures packed micro-batches at 91-96% of the "uniform" oracle (rows that
all have the mean length). This script explains the gap on one model, alternating the
contenders step by step (A/B/C/D, --repeats rounds, medians), forward + backward of one
16k-token micro-batch each:

    uniform|sdpa            the oracle: rows of the mean length, plain causal sdpa
    uniform|packing_varlen  the same rows flattened (cu_seq_lens every mean length): the
                            library's kernel on the oracle's work
    multipack|packing_varlen  the sampler's micro-batches (real, uneven lengths)
    multipack_as_mean|packing_varlen  the same tokens, cu_seq_lens cut every mean length:
                            the packed layout with the oracle's attention work

and, with torch.profiler, the GPU time of one step of each split into attention kernels,
matrix multiplies and everything else. Attention work per token is sum(s^2) / sum(s): for
uneven lengths it exceeds the mean length by E[s^2] / E[s]^2, which no packing can change.

Usage (GPU): python benchmarks/gpu/oracle_gap.py --size 200m --out benchmarks/results/oracle_gap
             (--kernel packing_fa4: the packed contenders on FlashAttention-4 instead of packing_varlen)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from packing_collators import FlatteningCollator, MultipackBatchSampler, register_varlen_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import SIZES, build_model, lengths_of, markov_tokens, to_device  # noqa: E402

CATEGORIES = {  # kernel-name fragments, checked in this order
    "attention": ("flash", "fmha", "attention", "attn", "sdpa", "cudnn"),
    "matmul": ("gemm", "cutlass", "xmma", "nvjet", "matmul", "sm90", "sm80"),
}


def category(kernel: str) -> str:
    name = kernel.lower()
    for cat, fragments in CATEGORIES.items():
        if any(f in name for f in fragments):
            return cat
    return "other"


def flat(segments: list[np.ndarray]) -> dict:
    return FlatteningCollator()([{"input_ids": s} for s in segments])


def contenders(examples, lengths, args) -> dict[str, list[tuple[str, dict]]]:
    """Per contender, a list of (attention implementation, CPU batch) to cycle through."""
    sampler = MultipackBatchSampler(lengths, args.tokens, seed=0, num_replicas=1, rank=0)
    batches = list(sampler)[: args.batches]
    mean = int(round(lengths.mean()))
    stream = np.concatenate([examples[i] for b in batches for i in b])
    k = args.kernel  # the packed contenders' attention: packing_varlen, packing_fa4, flash_attention_4
    result = {
        "uniform|sdpa": [],
        f"uniform|{k}": [],
        f"multipack|{k}": [],
        f"multipack_as_mean|{k}": [],
    }
    offset = 0
    for b in batches:
        tokens = int(lengths[b].sum())
        rows = tokens // mean
        chunk = stream[offset : offset + rows * mean]
        offset = (offset + rows * mean) % (len(stream) - args.tokens)
        grid = torch.from_numpy(chunk.reshape(rows, mean).copy())
        result["uniform|sdpa"].append(("sdpa", {"input_ids": grid, "labels": grid.clone()}))
        result[f"uniform|{k}"].append((k, flat(list(chunk.reshape(rows, mean)))))
        result[f"multipack|{k}"].append((k, flat([examples[i] for i in b])))
        same = np.concatenate([examples[i] for i in b])
        cuts = [same[j : j + mean] for j in range(0, len(same), mean)]
        result[f"multipack_as_mean|{k}"].append((k, flat(cuts)))
    return result


def attention_work(batch: dict) -> tuple[int, int]:
    """(tokens, sum of squared segment lengths) of a batch."""
    if "cu_seq_lens_q" in batch:
        s = np.diff(batch["cu_seq_lens_q"].numpy()).astype(np.int64)
    else:
        s = np.full(batch["input_ids"].shape[0], batch["input_ids"].shape[1], dtype=np.int64)
    return int(s.sum()), int((s * s).sum())


def step(model, attn: str, batch: dict) -> None:
    model.config._attn_implementation = attn
    n_items = int((batch["labels"][:, 1:] != -100).sum())
    loss = model(**batch, num_items_in_batch=n_items).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def profile(model, attn: str, batch: dict) -> dict[str, float]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step(model, attn, batch)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(model, attn, batch)
        torch.cuda.synchronize()
    totals = {"attention": 0.0, "matmul": 0.0, "other": 0.0}
    names: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            ms = event.device_time_total / 1e3  # us -> ms
            totals[category(event.name)] += ms
            if category(event.name) == "attention":
                names[event.name[:80]] = names.get(event.name[:80], 0.0) + ms
    totals["attention_kernels"] = dict(sorted(names.items(), key=lambda kv: -kv[1])[:4])
    return totals


def measure(model, plan, args, device) -> dict:
    gpu = {name: [to_device(b, device) for _, b in items] for name, items in plan.items()}
    attn = {name: items[0][0] for name, items in plan.items()}
    times = {name: [] for name in plan}
    tokens = {name: [] for name in plan}
    for r in range(args.warmup + args.repeats):
        for name in plan:  # alternate the contenders each round
            batch = gpu[name][r % len(gpu[name])]
            torch.cuda.synchronize()
            start = time.perf_counter()
            step(model, attn[name], batch)
            torch.cuda.synchronize()
            if r >= args.warmup:
                times[name].append(time.perf_counter() - start)
                tokens[name].append(attention_work(plan[name][r % len(gpu[name])][1])[0])
    result = {}
    for name in plan:
        work = [attention_work(b) for _, b in plan[name]]
        result[name] = {
            "tokens_per_s": statistics.median(t / s for t, s in zip(tokens[name], times[name])),
            "attention_tokens_per_token": sum(q for _, q in work) / sum(t for t, _ in work),
            "profile_ms": profile(model, attn[name], gpu[name][0]),
            "profiled_tokens": work[0][0],
        }
    return result


def report(results: dict, args, card: str) -> str:
    lines = [
        f"## Packed vs the uniform oracle, kernel by kernel: {args.size}, bf16, {card}",
        "",
        f"Forward + backward of one ~{args.tokens}-token micro-batch, contenders alternating, "
        f"median of {args.repeats} rounds. Kernel times (torch.profiler, one step) are scaled to "
        f"{args.tokens} tokens (a uniform batch holds whole rows of the mean length, up to one row fewer "
        f"tokens). Command: `{args.command}`",
        "",
    ]
    for dist, modes in results.items():
        oracle = modes["uniform|sdpa"]
        lines += [
            f"### {dist}",
            "",
            "| contender | tokens/s | vs oracle | attention work per token | attention ms | matmul ms | other ms | "
            "non-attention ms vs oracle |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def per_tokens(r: dict) -> dict:
            scale = args.tokens / r["profiled_tokens"]
            return {k: v * scale for k, v in r["profile_ms"].items() if k != "attention_kernels"}

        base_rest = per_tokens(oracle)["matmul"] + per_tokens(oracle)["other"]
        for name, r in modes.items():
            p = per_tokens(r)
            rest = p["matmul"] + p["other"]
            lines.append(
                f"| {name} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / oracle['tokens_per_s']:.1%} | "
                f"{r['attention_tokens_per_token']:.0f} | {p['attention']:.2f} | {p['matmul']:.2f} | "
                f"{p['other']:.2f} | {rest / base_rest:.1%} |"
            )
        lines.append("")
        for name, r in modes.items():
            lines.append(
                f"- {name} attention kernels (ms): "
                + "; ".join(f"`{k}` {v:.2f}" for k, v in r["profile_ms"]["attention_kernels"].items())
            )
        lines.append("")
    return "\n".join(lines)


def rewrite(args) -> None:
    """The markdown table again from a saved JSON; profiled_tokens recomputed from the (deterministic) plan."""
    saved = json.loads(args.from_json.read_text())
    args.command = saved["command"]
    for dist, modes in saved["results"].items():
        if all("profiled_tokens" in r for r in modes.values()):
            continue
        lengths = np.minimum(lengths_of(dist, args.examples, seed=args.seed), args.max_length)
        plan = contenders(markov_tokens(lengths, args.vocab, args.seed), lengths, args)
        for name, r in modes.items():
            r["profiled_tokens"] = attention_work(plan[name][0][1])[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "oracle_gap.json").write_text(json.dumps(saved, indent=1))
    text = report(saved["results"], args, saved["card"])
    (args.out / "oracle_gap.md").write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="200m")
    parser.add_argument("--distributions", default="flan_like,orcamath_like,sft")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--batches", type=int, default=32, help="distinct micro-batches per contender")
    parser.add_argument("--repeats", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kernel", default="packing_varlen", help="the packed contenders' attention (or packing_fa4)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--from-json", type=Path, help="rewrite the table from a results JSON (no GPU needed)")
    args = parser.parse_args()
    args.command = "python " + " ".join(sys.argv)
    if args.from_json:
        return rewrite(args)
    if not torch.cuda.is_available():
        raise SystemExit("oracle_gap.py needs a CUDA GPU (the varlen kernel and the profiler's CUDA times)")
    device = torch.device("cuda")
    register_varlen_attention()
    if args.kernel == "packing_fa4":
        from packing_collators.trainer import register_fa4_attention

        register_fa4_attention()
    model = build_model(args, "sdpa", device, torch.bfloat16)
    if args.kernel != "packing_varlen":  # FA4: compile its kernel variants before any timed step
        from packing_collators import warm_up_attention

        model.config._attn_implementation = args.kernel
        warm_up_attention(model, max_length=args.max_length)
    results = {}
    for dist in args.distributions.split(","):
        lengths = np.minimum(lengths_of(dist, args.examples, seed=args.seed), args.max_length)
        examples = markov_tokens(lengths, args.vocab, args.seed)
        results[dist] = measure(model, contenders(examples, lengths, args), args, device)
        print(dist, {k: round(v["tokens_per_s"]) for k, v in results[dist].items()}, flush=True)
    card = torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "oracle_gap.json").write_text(
        json.dumps({"card": card, "command": args.command, "results": results}, indent=1)
    )
    text = report(results, args, card)
    (args.out / "oracle_gap.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
