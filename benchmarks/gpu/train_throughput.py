"""GPU training throughput: padding vs packing vs a no-padding oracle, on the same examples.

Usage (GPU):  python benchmarks/gpu/train_throughput.py --size 200m --out benchmarks/results/train_throughput
              (every mode on three distributions, 3 alternating rounds: ~8.5 min on an H200)
Smoke (CPU):  python benchmarks/gpu/train_throughput.py --smoke --out /tmp/tt

Modes, attention backends, data, what is reported and the long-context command: see
docs/benchmarks.md#train_throughputpy.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from packing_collators import FlatteningCollator, MultipackBatchSampler, pack_lengths, warm_up_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import (  # noqa: E402
    LONG_CONTEXT,
    SIZES,
    CompileCounter,
    build_model,
    lengths_of,
    markov_tokens,
    median_round,
    padded_batch,
    sync,
    to_device,
)
from _throughput_report import ORACLES, report, save  # noqa: E402  (beside this script: its tables)

COMPILES = CompileCounter()  # FA4 kernel compiles (none without flash_attn.cute); timed steps must have none

PACKED_MODES = ("flattened", "flattened_like_padded", "prepacked_bfd", "multipack")
EVERY_ATTN = ("flattened", "multipack")  # the packed modes run on every --attn backend; the others on the first
ALL_MODES = ("padded_random", "padded_grouped", *PACKED_MODES, "prepacked_wrapped", "uniform", "uniform_work")


# ----------------------------------------------------------------------------- data
@dataclass
class Plan:
    """What one mode trains on: a list of steps, each a list of micro-batches (lists of features)."""

    steps: list[list[list[dict]]]
    layout: str  # "padded", "flat" or "rows"


class MicroBatches(torch.utils.data.Dataset):
    """Collates micro-batch i in a DataLoader worker, so collation is off the GPU's critical path."""

    def __init__(self, plan: Plan, pad_to: int | None = None, *, flat_rows: bool = False):
        self.items = [mb for step in plan.steps for mb in step]
        self.layout = "flat" if flat_rows and plan.layout == "rows" else plan.layout  # rows as flat examples
        self.flatten = FlatteningCollator(pad_to_multiple_of=pad_to)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        if self.layout == "flat":
            return self.flatten([f if isinstance(f, dict) else {"input_ids": f} for f in self.items[i]])
        if self.layout == "rows":
            ids = torch.from_numpy(np.stack(self.items[i]))
            return {"input_ids": ids, "labels": ids.clone()}
        return padded_batch(self.items[i])


def make_plans(examples, lengths, args, rng) -> dict[str, Plan]:
    """The same examples for every mode; the first three modes also share each step's examples."""
    per_step = max(1, round(args.tokens_per_step / lengths.mean()))
    order = rng.permutation(len(examples))
    step_sets = [order[s * per_step : (s + 1) * per_step] for s in range(args.warmup + args.steps)]
    feats = [{"input_ids": e} for e in examples]

    def cut(indices, size):
        return [[feats[i] for i in indices[j : j + size]] for j in range(0, len(indices), size)]

    def budget_cut(indices):  # next-fit into micro-batches of at most tokens_per_micro tokens
        result = pack_lengths(lengths[indices], args.micro_tokens, strategy="next_fit")
        return [[feats[indices[k]] for k in row] for row in result.rows]

    plans = {
        "padded_random": Plan([cut(s, args.batch_size) for s in step_sets], "padded"),
        "padded_grouped": Plan([cut(s[np.argsort(lengths[s])], args.batch_size) for s in step_sets], "padded"),
        "flattened": Plan([budget_cut(s) for s in step_sets], "flat"),
        "flattened_like_padded": Plan([cut(s, args.batch_size) for s in step_sets], "flat"),
    }
    n_steps = args.warmup + args.steps
    rows_per_step = max(1, args.tokens_per_step // args.max_length)
    packed = pack_lengths(lengths, args.max_length)
    row_order = rng.permutation(packed.num_rows)[: n_steps * rows_per_step]
    bfd_steps = [
        [[feats[i] for r in row_order[s * rows_per_step : (s + 1) * rows_per_step] for i in packed[r]]]
        for s in range(n_steps)
    ]
    plans["prepacked_bfd"] = Plan(bfd_steps, "flat")
    stream = np.concatenate([examples[i] for i in order])

    def rows(length: int, count: int) -> Plan:  # the stream of tokens cut into ``count`` rows of ``length`` a step
        steps = np.resize(stream, n_steps * count * length).reshape(n_steps, count, length)
        return Plan([[list(step)] for step in steps], "rows")

    plans["prepacked_wrapped"] = rows(args.max_length, rows_per_step)
    sampler = MultipackBatchSampler(lengths, args.tokens_per_step, seed=args.seed, num_replicas=1, rank=0)
    plans["multipack"] = Plan([[[feats[i] for i in b]] for b in list(sampler)[:n_steps]], "flat")
    mean, work = int(round(lengths.mean())), work_length(lengths, args.tokens_per_step)
    plans["uniform"] = rows(mean, args.tokens_per_step // mean)
    plans["uniform_work"] = rows(work, args.tokens_per_step // work)
    return plans


def work_length(lengths: np.ndarray, tokens_per_step: int) -> int:
    """The row length whose attention per token equals the data's: sum(l^2) / sum(l), at most a step."""
    squares = float((lengths.astype(np.float64) ** 2).sum())
    return max(1, min(tokens_per_step, int(round(squares / float(lengths.sum())))))


# ----------------------------------------------------------------------------- model
def flops_per_step(n_params: int, layers: int, hidden: int, segments: list[int]) -> float:
    """6 N per token for the matmuls plus causal attention: 6 * layers * hidden * sum(s^2) (fwd + bwd)."""
    return 6 * n_params * sum(segments) + 6 * layers * hidden * sum(s * s for s in segments)


def segment_lengths(batch: dict, layout: str) -> list[int]:
    if "cu_seq_lens_q" in batch:
        return np.diff(batch["cu_seq_lens_q"].numpy()).tolist()
    if layout == "padded":
        return batch["attention_mask"].sum(1).tolist()
    return [batch["input_ids"].shape[1]] * batch["input_ids"].shape[0]


def train(plan: Plan, attn: str, args, device, dtype, val_batches) -> dict:
    began = time.perf_counter()
    model = build_model(args, attn, device, dtype)
    if args.grad_checkpointing:
        from packing_collators._compat import enable_activation_checkpointing

        enable_activation_checkpointing(model, {"use_reentrant": False})
    built = time.perf_counter() - began
    n_params = sum(p.numel() for p in model.parameters())
    hidden, layers = SIZES[args.size][0], SIZES[args.size][1]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, weight_decay=0.0, **({"fused": True} if device.type == "cuda" else {})
    )
    loader = torch.utils.data.DataLoader(
        MicroBatches(
            plan, args.flex_pad if attn == "flex_attention" and args.flex_pad else None, flat_rows=attn != "sdpa"
        ),
        batch_size=None,
        shuffle=False,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=4 if args.workers else None,
        persistent_workers=False,
    )
    batches = iter(loader)
    if attn != "sdpa" and not args.no_attention_warmup:  # compile every kernel variant before the first step
        compiled = COMPILES.count
        warm = warm_up_attention(model, max_length=args.max_length)
        print(f"    [{attn}] attention warm-up {warm:.1f}s, {COMPILES.count - compiled} FA4 compiles", flush=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, val_losses, slots, flops, step_times, issue_shares = [], [], 0, 0.0, [], []
    compiles = {"warmup": 0, "timed": 0}  # FA4 compiles in the warm-up steps and in the timed ones
    window = args.timing == "window"  # timed steps back to back: this script syncs only at each end
    for step, micro_batches in enumerate(plan.steps):
        if not window or step == args.warmup:
            sync(device)
        compiled_before = COMPILES.count
        start = time.perf_counter()
        if step == args.warmup:
            window_start = start
        cpu_batches = [next(batches) for _ in micro_batches]
        n_items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in cpu_batches)
        total = 0.0
        for cpu_batch in cpu_batches:
            batch = to_device(cpu_batch, device)
            loss = model(**batch, num_items_in_batch=n_items).loss
            loss.backward()
            total += loss.detach()
            if step >= args.warmup:
                segs = segment_lengths(cpu_batch, plan.layout)
                flops += flops_per_step(n_params, layers, hidden, segs)
                slots += cpu_batch["input_ids"].numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        issued = time.perf_counter()  # the host has queued the whole step; the GPU may still be busy
        compiles["timed" if step >= args.warmup else "warmup"] += COMPILES.count - compiled_before  # host-side
        losses.append(total if window else float(total))  # float() waits for the GPU
        if window:
            continue
        sync(device)
        if step >= args.warmup:
            step_times.append(time.perf_counter() - start)
            issue_shares.append((issued - start) / step_times[-1])
        if args.eval_every and (step + 1) % args.eval_every == 0:
            val_losses.append((step + 1, evaluate(model, val_batches, device)))
    if window:
        sync(device)
        seconds = time.perf_counter() - window_start
        losses = [float(x) for x in losses]
    else:
        seconds = sum(step_times)
    print(
        f"    [{attn}] build {built:.1f}s, whole run {time.perf_counter() - began:.1f}s, timed steps {seconds:.1f}s",
        flush=True,
    )
    real = sum(
        len(f["input_ids"]) if isinstance(f, dict) else len(f)
        for st in plan.steps[args.warmup :]
        for mb in st
        for f in mb
    )
    result = {
        "real_tokens_per_s": real / seconds,
        "steps_per_s": args.steps / seconds,
        "padding_fraction": 1 - real / slots,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        "achieved_tflops": flops / seconds / 1e12,
        # median share of a step the host spent queuing its work: near 1, the GPU waits on Python/launches
        "host_issue_share": float(np.median(issue_shares)) if issue_shares else None,
        "train_loss": losses,
        "val_loss": val_losses,
        "params": n_params,
        "fa4_compiles_warmup": compiles["warmup"],
        "fa4_compiles_timed": compiles["timed"],
        "fa4_compile_seconds_total": COMPILES.seconds,
    }
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


@torch.no_grad()
def evaluate(model, val_batches, device) -> float:
    model.eval()
    n_items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in val_batches)
    total = sum(float(model(**to_device(b, device), num_items_in_batch=n_items).loss) for b in val_batches)
    model.train()
    return total


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="200m")
    parser.add_argument("--distributions", default="flan_like,orcamath_like,sft")
    parser.add_argument("--modes", default=",".join(ALL_MODES))
    parser.add_argument(
        "--attn",
        default="packing_varlen" + (",flash_attention_2" if importlib.util.find_spec("flash_attn") else ""),
        help="backends for the packed modes (default: packing_varlen, plus flash_attention_2 where "
        "flash-attn is installed; flex_attention recompiles for every packed length in training)",
    )
    parser.add_argument(
        "--flex-pad",
        type=int,
        default=16384,
        help="flex_attention runs pad each flat micro-batch to a multiple of this (a padding segment, "
        "labels -100), so its shape is static and transformers' compiled flex kernel is reused "
        "instead of recompiled for every new length; 0 turns it off",
    )
    parser.add_argument(
        "--oracle-attn",
        default="sdpa",
        help="backends for the uniform modes (sdpa: padded rows, plain causal; a packed backend such as "
        "flash_attention_4 runs the same rows as a flat batch, so packed and oracle share one kernel)",
    )
    parser.add_argument(
        "--timing",
        choices=("step", "window"),
        default="step",
        help="step: each timed step synchronised on its own (and its host-queue share recorded); window: "
        "the timed steps back to back with no sync of this script's between them (one at each end), so "
        "the host may queue the optimizer step and the next batch while the GPU finishes; the model's "
        "forward still syncs once per step (transformers' packed-sequence check), as does Trainer's "
        "default NaN/inf loss filter (needs --eval-every 0)",
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--no-attention-warmup",
        action="store_true",
        help="skip warm_up_attention (compiling FA4's kernel variants for short and long batches first)",
    )
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    parser.add_argument(
        "--micro-tokens",
        type=int,
        default=32768,
        help="token budget of a flattened micro-batch (default: a whole step in one)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="examples per padded micro-batch")
    parser.add_argument(
        "--max-length",
        type=int,
        default=2048,
        help="longest example; the long-context distributions (long_tail, reasoning) are drawn up to it",
    )
    parser.add_argument(
        "--grad-checkpointing",
        action="store_true",
        help="recompute activations in the backward (as long-context runs train)",
    )
    parser.add_argument("--examples", type=int, default=12000)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every mode this many times, alternating, and report each mode's median round",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 CPU run with sdpa (checks the script)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.command = "python " + " ".join(sys.argv)
    if args.smoke:
        args.size, args.vocab, args.steps, args.warmup, args.examples = "tiny", 128, 4, 1, 3000
        args.tokens_per_step = args.micro_tokens = 2048
        args.max_length, args.attn, args.workers = 512, "sdpa", 0
        args.eval_every = 0 if args.timing == "window" else 2
        args.rounds = min(args.rounds, 2)
    if args.timing == "window" and args.eval_every:
        parser.error(
            "--timing window times the steps as one span; an evaluation inside it would count: add --eval-every 0"
        )
    args.attn, args.oracle_attn = args.attn.split(","), args.oracle_attn.split(",")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    args.out.mkdir(parents=True, exist_ok=True)
    results, out_of_memory = {}, {}
    for dist in args.distributions.split(","):
        rng = np.random.default_rng(args.seed)
        high = args.max_length if dist in LONG_CONTEXT else None
        lengths = np.minimum(lengths_of(dist, args.examples, seed=args.seed, high=high), args.max_length)
        if args.smoke:
            lengths = np.maximum(lengths // 8, 2)
        began = time.perf_counter()
        examples = markov_tokens(lengths, args.vocab, args.seed)
        plans = make_plans(examples, lengths, args, rng)
        print(f"{dist}: data and plans in {time.perf_counter() - began:.1f}s", flush=True)
        val = [FlatteningCollator()([{"input_ids": e} for e in examples[-64:]])]
        padded_val = [padded_batch([{"input_ids": e} for e in examples[-64:]])]
        runs: dict[str, list[dict]] = {}
        for _ in range(args.rounds):  # modes alternate within each round; each mode reports its median round
            for mode in args.modes.split(","):
                if mode in ORACLES:
                    backends = args.oracle_attn
                elif mode in PACKED_MODES:
                    backends = args.attn if mode in EVERY_ATTN else args.attn[:1]
                else:
                    backends = ["sdpa"]
                for attn in backends:
                    val_batches = val if attn != "sdpa" or mode in PACKED_MODES else padded_val
                    try:
                        r = train(plans[mode], attn, args, device, dtype, val_batches)
                    except torch.OutOfMemoryError as error:  # reported in results.json, the other modes go on
                        print(f"{dist:14s} {mode:18s} {attn:15s} out of memory: {str(error)[:200]}", flush=True)
                        out_of_memory.setdefault(dist, []).append(f"{mode}|{attn}")
                        torch.cuda.empty_cache()
                        continue
                    runs.setdefault(f"{mode}|{attn}", []).append(r)
                    results[dist] = {key: median_round(rs) for key, rs in runs.items()}
                    save(results, out_of_memory, args)  # after every run: a run cut short keeps what it measured
                    print(
                        f"{dist:14s} {mode:18s} {attn:15s} {r['real_tokens_per_s']:>12,.0f} tok/s  "
                        f"pad {r['padding_fraction']:.1%}  loss {r['train_loss'][-1]:.4f}  "
                        f"mem {r['peak_memory_gib'] or 0:.1f} GiB",
                        flush=True,
                    )
    markdown = report(results, args, out_of_memory)
    (args.out / "train_throughput.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
