"""GPU: packed training under torch.compile, against the no-padding oracle, compiled and eager.

Usage (one H100; --budget-s stops starting rounds past it, results so far are written):
    python benchmarks/gpu/compile_throughput.py --size 200m --out benchmarks/results/compile_200m   (~4 min)
    python benchmarks/gpu/compile_throughput.py --size 1b --out benchmarks/results/compile_1b       (~5 min)
Smoke (CPU, sdpa, aot_eager, tiny model): python benchmarks/gpu/compile_throughput.py --smoke --out /tmp/ct

Modes, the timed-step sample, warm-ups and recompile checks: see docs/benchmarks.md#compile_throughputpy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from packing_collators import FlatteningCollator, MultipackBatchSampler, warm_up_attention
from packing_collators.collate import bucket_padding_fraction
from packing_collators.models._compile_layers import graphs_compiled
from packing_collators.collate._bucketed import compile_buckets
from packing_collators.trainer._compile import warm_up_compiled

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import CompileCounter, build_model, command, lengths_of, loss_gap, markov_tokens, median, sync, to_device  # noqa: E402

FA4_COMPILES = CompileCounter()  # FA4 kernel compiles (0 without flash_attn.cute)
MODES = ("compiled_packed", "compiled_oracle", "compiled_same_work", "eager_packed", "eager_oracle")
STEPS = {"tiny": 2, "200m": 20, "1b": 8}  # timed steps per run: 36 runs + compiles in ~4 min (200M) / ~5 min (1B), H100


# ----------------------------------------------------------------------------- data
def sample_steps(fills: np.ndarray, count: int) -> np.ndarray:
    """Positions of ``count`` steps at evenly spaced quantiles (midpoints) of ``fills``, in epoch order.

    >>> sample_steps(np.array([16380, 851, 16384, 16300, 16370, 16379]), 3).tolist()  # not the tail bin
    [2, 3, 5]
    """
    if count >= len(fills):
        return np.arange(len(fills))
    by_fill = np.argsort(fills, kind="stable")
    return np.sort(by_fill[((np.arange(count) + 0.5) * len(fills) / count).astype(np.int64)])


def packed_batches(lengths, tokens, args, *, bucket: int | None) -> tuple[tuple[list[dict], list[int]], dict]:
    """A fill-representative sample of a multipack epoch's steps at the budget (``sample_steps``), collated
    (padded to ``bucket`` if given), with their real (example) token counts."""
    sampler = MultipackBatchSampler(lengths, args.tokens_per_step, seed=args.seed, num_replicas=1, rank=0)
    epoch = list(sampler)
    fills = np.array([int(lengths[indices].sum()) for indices in epoch])
    plan = [epoch[i] for i in sample_steps(fills, args.warmup + args.steps)]
    collate = FlatteningCollator(pad_to_buckets=[bucket] if bucket else None)
    batches = [collate([{"input_ids": tokens[i]} for i in indices]) for indices in plan]
    reals = [int(lengths[indices].sum()) for indices in plan]
    stats = {
        "epoch_steps": len(epoch),
        "epoch_fill": round(float(fills.mean()) / args.tokens_per_step, 4),
        "sample_fill": round(float(np.mean(reals[args.warmup :])) / args.tokens_per_step, 4),
        "epoch_bucket_padding": bucket_padding_fraction(sampler.plan().row_tokens, [args.tokens_per_step]),
        "mean_length": round(float(lengths.mean()), 1),
        "attention_weighted_length": round(float((lengths**2).sum() / lengths.sum()), 1),
    }
    return (batches, reals), stats


def same_work_batches(lengths, tokens, args) -> tuple[list[dict], list[int]]:
    """Steps of exactly the budget cut from the examples laid end to end (shuffled): the data's own
    lengths with no padding (an example crossing a step boundary is cut, each piece a sequence)."""
    order = np.random.default_rng(args.seed).permutation(len(lengths))
    ends = np.cumsum(lengths[order])
    need = (args.warmup + args.steps) * args.tokens_per_step
    if ends[-1] < need:
        raise ValueError(f"--examples too few: {ends[-1]} tokens, the same-work oracle needs {need}")
    stream = np.concatenate([tokens[i] for i in order[: int(np.searchsorted(ends, need)) + 1]])[:need]
    boundaries = ends[ends < need]
    collate, batches = FlatteningCollator(), []
    for step in range(args.warmup + args.steps):
        start, stop = step * args.tokens_per_step, (step + 1) * args.tokens_per_step
        cuts = boundaries[(boundaries > start) & (boundaries < stop)] - start
        batches.append(collate([{"input_ids": piece} for piece in np.split(stream[start:stop], cuts)]))
    return batches, [args.tokens_per_step] * len(batches)  # no padding: every token real


def oracle_batches(lengths, tokens, args) -> tuple[list[dict], list[int]]:
    """Steps of rows of the mean length cut from the token stream (the last row of a step the remainder)."""
    mean = int(round(lengths.mean()))
    stream = np.concatenate(tokens)
    need = (args.warmup + args.steps) * args.tokens_per_step
    stream = np.resize(stream, need).reshape(args.warmup + args.steps, args.tokens_per_step)
    cuts = list(range(0, args.tokens_per_step, mean))[1:]
    collate = FlatteningCollator()
    batches = [collate([{"input_ids": row} for row in np.split(step, cuts)]) for step in stream]
    return batches, [args.tokens_per_step] * len(batches)  # no padding: every token real


# ----------------------------------------------------------------------------- training
def run(mode: str, steps: tuple[list[dict], list[int]], model, compiled, initial: dict, args, device) -> dict:
    """Train ``args.warmup + args.steps`` steps from the initial weights; time the last ``args.steps``."""
    model.load_state_dict(initial)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, weight_decay=0.0, **({"fused": True} if device.type == "cuda" else {})
    )
    forward = compiled if mode.startswith("compiled") else model
    batches, reals = steps
    losses, marks = [], {}
    for step, cpu_batch in enumerate(batches):
        if step == args.warmup:
            sync(device)
            marks = {"start": time.perf_counter(), "graphs": graphs_compiled(), "fa4": FA4_COMPILES.count}
        batch = to_device(cpu_batch, device)
        items = (cpu_batch["labels"][:, 1:] != -100).sum().to(device)
        loss = forward(**batch, num_items_in_batch=items).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    sync(device)
    seconds = time.perf_counter() - marks["start"]
    timed = batches[args.warmup :]
    real = sum(reals[args.warmup :])
    del optimizer
    return {
        "real_tokens_per_s": real / seconds,
        "seconds": seconds,
        "padding_fraction": 1 - real / sum(b["input_ids"].shape[1] for b in timed),
        "recompiles_timed": graphs_compiled() - marks["graphs"],
        "fa4_compiles_timed": FA4_COMPILES.count - marks["fa4"],
        "train_loss": [float(x) for x in losses],
    }


def warm_up(model, compiled, args, device) -> dict:
    """FA4's kernel variants (eager) and the compiled graphs, before any timed step; their seconds and counts."""
    started, fa4 = time.perf_counter(), FA4_COMPILES.count
    if args.attn != "sdpa":
        warm_up_attention(model, max_length=args.tokens_per_step)
    fa4_seconds = time.perf_counter() - started

    def step(cpu_batch: dict) -> None:
        batch = to_device(cpu_batch, device)
        items = (cpu_batch["labels"][:, 1:] != -100).sum().to(device)
        compiled(**batch, num_items_in_batch=items).loss.backward()

    bucket = compile_buckets(args.tokens_per_step)
    collate = FlatteningCollator(pad_to_buckets=bucket)
    seconds, graphs = warm_up_compiled(step, collate, bucket, vocab=args.vocab)
    model.zero_grad(set_to_none=True)
    sync(device)
    return {
        "attention_warm_up_s": fa4_seconds,
        "fa4_compiles_warm_up": FA4_COMPILES.count - fa4,
        "compile_s": seconds,
        "graphs": graphs,
        "bucket": list(bucket),
    }


# ----------------------------------------------------------------------------- report
def summarise(results: dict, stats: dict) -> dict:
    """Per distribution: each mode's median round, the ratios to each oracle, losses compiled vs eager."""
    summary = {}
    for dist, modes in results.items():
        tps = {m: median([r["real_tokens_per_s"] for r in rounds]) for m, rounds in modes.items() if rounds}
        if len(tps) < len(MODES):
            continue
        first = {m: rounds[0]["train_loss"] for m, rounds in modes.items()}
        fill = stats[dist]["epoch_fill"] / stats[dist]["sample_fill"]  # the packed rate at the epoch's fill
        epoch_tps = {m: t * fill if m.endswith("packed") else t for m, t in tps.items()}
        summary[dist] = {
            "tokens_per_s": tps,
            "epoch_tokens_per_s": epoch_tps,
            "compiled_packed_vs_compiled_oracle": tps["compiled_packed"] / tps["compiled_oracle"],
            "compiled_packed_vs_compiled_same_work": tps["compiled_packed"] / tps["compiled_same_work"],
            "epoch_compiled_packed_vs_compiled_oracle": epoch_tps["compiled_packed"] / tps["compiled_oracle"],
            "epoch_compiled_packed_vs_compiled_same_work": epoch_tps["compiled_packed"] / tps["compiled_same_work"],
            "compiled_same_work_vs_compiled_oracle": tps["compiled_same_work"] / tps["compiled_oracle"],
            "compiled_packed_vs_eager_oracle": tps["compiled_packed"] / tps["eager_oracle"],
            "compiled_packed_vs_eager_packed": tps["compiled_packed"] / tps["eager_packed"],
            "eager_packed_vs_eager_oracle": tps["eager_packed"] / tps["eager_oracle"],
            "loss_gap_packed": loss_gap(first["compiled_packed"], first["eager_packed"]),
            "loss_gap_oracle": loss_gap(first["compiled_oracle"], first["eager_oracle"]),
            "recompiles_timed": sum(r["recompiles_timed"] for rounds in modes.values() for r in rounds),
            "fa4_compiles_timed": sum(r["fa4_compiles_timed"] for rounds in modes.values() for r in rounds),
            "padding_fraction_compiled_packed": median([r["padding_fraction"] for r in modes["compiled_packed"]]),
        }
    return summary


def markdown(summary: dict, warm: dict, stats: dict, args, card: str) -> str:
    lines = [
        f"# torch.compile, packed vs oracle: {args.size} on {card} (attention {args.attn}, {args.rounds} rounds)",
        "",
        f"Command: `{command()}`",
        "",
        f"Compile before the first step: {warm['graphs']} graph(s), {warm['compile_s']:.1f} s (bucket "
        f"{warm['bucket']}); FA4 kernels: {warm['fa4_compiles_warm_up']} compiled in {warm['attention_warm_up_s']:.1f} s.",
        "",
        "| distribution | mean / attention-weighted length | fill sample / epoch | compiled packed tok/s | compiled "
        "oracle | compiled same-work | eager packed | eager oracle | packed/oracle (compiled) | packed/same-work "
        "(compiled) | epoch: packed/oracle, packed/same-work | compiled packed / eager oracle | compiled / eager "
        "packed | recompiles timed | loss gap |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dist, s in summary.items():
        t, d = s["tokens_per_s"], stats[dist]
        lines.append(
            f"| {dist} | {d['mean_length']:.0f} / {d['attention_weighted_length']:.0f} | "
            f"{100 * d['sample_fill']:.2f}% / {100 * d['epoch_fill']:.2f}% | {t['compiled_packed']:,.0f} | "
            f"{t['compiled_oracle']:,.0f} | {t['compiled_same_work']:,.0f} | {t['eager_packed']:,.0f} | "
            f"{t['eager_oracle']:,.0f} | {100 * s['compiled_packed_vs_compiled_oracle']:.1f}% | "
            f"{100 * s['compiled_packed_vs_compiled_same_work']:.1f}% | "
            f"{100 * s['epoch_compiled_packed_vs_compiled_oracle']:.1f}%, "
            f"{100 * s['epoch_compiled_packed_vs_compiled_same_work']:.1f}% | "
            f"{s['compiled_packed_vs_eager_oracle']:.3f}x | {s['compiled_packed_vs_eager_packed']:.3f}x | "
            f"{s['recompiles_timed']} (+{s['fa4_compiles_timed']} FA4) | "
            f"{100 * max(s['loss_gap_packed'], s['loss_gap_oracle']):.2f}% |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(STEPS), default="200m")
    parser.add_argument("--distributions", default="flan_like,orcamath_like,sft")
    parser.add_argument("--attn", default="packing_fa4", help="packing_fa4 (default) or packing_varlen")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default: by --size)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of each run")
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    parser.add_argument("--examples", type=int, default=12000)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode (default: none)")
    parser.add_argument("--budget-s", type=float, default=420, help="start no round after this many seconds")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 CPU run with sdpa and aot_eager")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.attn, args.backend, args.rounds = "tiny", "sdpa", "aot_eager", 1
        args.examples, args.tokens_per_step, args.vocab, args.warmup, args.max_length = 400, 512, 256, 1, 256
    args.steps = STEPS[args.size] if args.steps is None else args.steps
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    card = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    model = build_model(args, args.attn, device, dtype)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    compiled = torch.compile(model, backend=args.backend, mode=args.compile_mode)
    print(f"{args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M) on {card}, {args.attn}", flush=True)
    try:
        warm = warm_up(model, compiled, args, device)
        modes = MODES
    except Exception as error:  # noqa: BLE001  (the eager modes still run; the error is in results.json)
        traceback.print_exc()
        warm = {"error": f"{type(error).__name__}: {error}"[:2000], "graphs": 0, "compile_s": 0.0, "bucket": []}
        warm.update(attention_warm_up_s=0.0, fa4_compiles_warm_up=0)
        modes = tuple(m for m in MODES if m.startswith("eager"))
    print(f"  warm-up: {json.dumps(warm)}", flush=True)
    bucket = compile_buckets(args.tokens_per_step)[0]
    data, stats = {}, {}
    for i, dist in enumerate(args.distributions.split(",")):
        lengths = lengths_of(dist, args.examples, seed=args.seed + i, high=args.max_length)
        tokens = markov_tokens(lengths, args.vocab, seed=args.seed + i)
        (packed, stats[dist]), (unpadded, _) = (packed_batches(lengths, tokens, args, bucket=b) for b in (bucket, None))
        oracle = oracle_batches(lengths, tokens, args)
        data[dist] = {
            "compiled_same_work": same_work_batches(lengths, tokens, args),
            "compiled_packed": packed,
            "eager_packed": unpadded,
            "compiled_oracle": oracle,
            "eager_oracle": oracle,
        }
    results = {dist: {mode: [] for mode in modes} for dist in data}
    for round_ in range(args.rounds):
        if time.perf_counter() - started > args.budget_s:
            print(f"  --budget-s {args.budget_s:.0f} passed: no round {round_ + 1}", flush=True)
            break
        for dist in data:
            for mode in modes if round_ % 2 == 0 else tuple(reversed(modes)):
                result = run(mode, data[dist][mode], model, compiled, initial, args, device)
                results[dist][mode].append(result)
                print(f"  round {round_ + 1} {dist:14s} {mode:16s} {result['real_tokens_per_s']:>11,.0f} tok/s "
                      f"recompiles {result['recompiles_timed']} fa4 {result['fa4_compiles_timed']}", flush=True)  # fmt: skip
    summary = summarise(results, stats)
    report = markdown(summary, warm, stats, args, card)
    args.out.mkdir(parents=True, exist_ok=True)
    options = {k: str(v) for k, v in vars(args).items()}
    payload = {"card": card, "torch": torch.__version__, "command": command(), "args": options, "warm_up": warm,
               "data": stats, "summary": summary, "results": results, "seconds": time.perf_counter() - started}  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(payload, indent=1) + "\n")
    (args.out / "summary.md").write_text(report)
    print(report + f"wrote {args.out}/results.json and summary.md ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
