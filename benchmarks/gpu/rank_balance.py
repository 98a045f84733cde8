"""Rank balance on two GPUs, measured: does the sampler's cost model keep the ranks in step?

Issue #18 item 3. MultipackBatchSampler deals each step's bins to ranks by a cost; a rank
that gets the costlier bin makes the other wait at the gradient all-reduce. This script
times it on long-context data, where attention (sum of squared example lengths) makes
bins of equal tokens cost unequal time. One model (``_shared.build_model``, bf16, DDP) is
built once; then, on the same plan seed, for each ``--balances`` mode (``cost``, ``tokens``,
``attention``, ``none``) every rank trains its own batches of that mode's plan, step by step:

    collate (CPU) -> to GPU -> barrier -> t0 -> forward + backward (DDP no_sync) -> sync
        compute = now - t0
    all_reduce of one number -> sync              wait = this rank's wait for the other

so ``compute`` is the rank's own forward + backward time (no gradient communication, no
optimizer step) and the faster rank's ``wait`` is the time balance loses per step.

Reported per mode, on exactly the timed steps: the measured step imbalance (sum over steps
of the slowest rank's compute / sum of the mean rank's compute - 1, the definition of the
sampler's ``stats()["step_imbalance"]``) beside the planned one (the same formula on the
batches' cost ``tokens + attention / max_tokens_per_batch``), the measured one corrected for
the two cards' own speed difference, the faster rank's wait (median ms per step and share
of its step time) and forward + backward tokens/s.

Calibration first: both ranks run the same batches (bins of the plan at spread-out
attention, cut in turn to all, 1/2 and 1/4 of the budget), so the ratio of their times is
the cards' own difference. Then the cost model is fitted from all measured (rank, step) points
(calibration ones included: planned bins are nearly all full, so without the part-full ones
``per_token * tokens`` and ``fixed`` could not be told apart):

    seconds = per_token * tokens + per_attention * sum(length**2) + fixed   (least squares, >= 0)

(``packing_collators.fit_attention_weight``), and every mode's plan is re-scored with it
(does it predict the measured imbalance better than the default?). One more mode,
``cost_fitted``, plans ``balance="cost"`` with ``attention_weight = per_attention / per_token``
and is timed like the others.

Writes OUT/NAME.json (every per-step number, card, command, versions) and OUT/NAME.md (the
table, calibration and fit), after each mode, so a run cut short keeps what it measured.

Usage (2 GPUs; 1B, gradient checkpointing, FlashAttention-4):
  torchrun --nproc_per_node 2 benchmarks/gpu/rank_balance.py --grad-checkpointing \\
      --distribution long_tail --max-length 8192 --tokens-per-batch 32768 --steps 16 --out OUT
  torchrun --nproc_per_node 2 benchmarks/gpu/rank_balance.py --grad-checkpointing \\
      --distribution reasoning --max-length 32768 --tokens-per-batch 65536 --steps 8 --out OUT
CPU check (gloo, tiny fp32 model, sdpa):
  torchrun --nproc_per_node 2 benchmarks/gpu/rank_balance.py --smoke --out /tmp/rank_balance
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from packing_collators import FlatteningCollator, MultipackBatchSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import (  # noqa: E402
    DISTRIBUTIONS,
    RESULTS,
    CompileCounter,
    add_run_arguments,
    build_model,
    finish_run_arguments,
    lengths_of,
    to_device,
)

BALANCES = ("cost", "tokens", "attention", "none")
FITTED = "cost_fitted"
CALIBRATION_FILL = (1.0, 0.5, 0.25)  # calibration batches' share of the budget, in turn
BAR = 0.03  # issue #18: balance="cost" keeps the measured step imbalance within 3%


# ----------------------------------------------------------------------------- plans and imbalance
def step_imbalance(per_step: np.ndarray) -> float:
    """(steps, ranks) costs or seconds -> sum of each step's max / sum of each step's mean - 1."""
    mean = per_step.mean(1).sum()
    return float(per_step.max(1).sum() / mean - 1) if mean else 0.0


def planner(lengths: np.ndarray, args, rank: int, balance: str, attention_weight: float | None = None):
    """This rank's sampler for ``balance``; its ``plan()`` holds every rank's batches (no collective)."""
    weight = {} if attention_weight is None else {"attention_weight": attention_weight}
    return MultipackBatchSampler(
        lengths,
        args.tokens_per_batch,
        seed=args.seed,
        num_replicas=args.replicas,
        rank=rank,
        balance="cost" if balance == FITTED else balance,
        check_ranks=False,
        **weight,
    )


def calibration_batches(plan, lengths: np.ndarray, count: int) -> list[list[int]]:
    """``count`` bins of the plan at evenly spread attention, cut in turn to all, the first 1/2 and 1/4 of the budget."""
    order = np.argsort(plan.batch_attention, kind="stable")
    picks = order[np.linspace(0, len(order) - 1, count).round().astype(int)]
    batches = []
    for j, b in enumerate(picks):
        indices = plan.indices[plan.batch_offsets[b] : plan.batch_offsets[b + 1]]
        keep = np.cumsum(lengths[indices]) <= plan.max_tokens_per_batch * CALIBRATION_FILL[j % len(CALIBRATION_FILL)]
        keep[0] = True  # at least one example
        batches.append(indices[keep].tolist())
    return batches


# ----------------------------------------------------------------------------- timed steps
class Stepper:
    """Times this rank's forward + backward on a batch of example indices, and its wait for the others."""

    def __init__(self, model, lengths: np.ndarray, args, device: torch.device, compiles: CompileCounter):
        self.model, self.lengths, self.args, self.device, self.compiles = model, lengths, args, device, compiles
        self.collate = FlatteningCollator()
        self.flag = torch.ones(1, device=device)

    def tokens_of(self, index: int) -> np.ndarray:
        """Random token ids of example ``index`` (seeded by it: only the examples a step uses are made)."""
        rng = np.random.default_rng([self.args.seed, index])
        return rng.integers(0, self.args.vocab, int(self.lengths[index]))

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def __call__(self, indices: list[int]) -> dict:
        batch = to_device(self.collate([{"input_ids": self.tokens_of(i)} for i in indices]), self.device)
        self.sync()
        dist.barrier(**({"device_ids": [torch.cuda.current_device()]} if self.device.type == "cuda" else {}))
        compiled = self.compiles.count
        started = time.perf_counter()
        with self.model.no_sync():
            self.model(**batch).loss.backward()
        self.sync()
        computed = time.perf_counter()
        dist.all_reduce(self.flag)
        self.sync()
        waited = time.perf_counter()
        self.model.zero_grad(set_to_none=True)
        sizes = self.lengths[indices]
        return {
            "compute_s": computed - started,
            "wait_s": waited - computed,
            "tokens": int(sizes.sum()),
            "attention": int((sizes**2).sum()),
            "sequences": len(indices),
            "compiles": self.compiles.count - compiled,
        }


def run_steps(stepper: Stepper, batches: list[list[int]], warmup: int) -> dict:
    """Per-step records of the timed steps (after ``warmup`` untimed ones), gathered from every rank."""
    records = [stepper(batch) for batch in batches]
    mine = {key: [r[key] for r in records[warmup:]] for key in records[0]}
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return {"per_rank": ranks}


def grid(per_rank: list[dict], key: str) -> np.ndarray:
    """(steps, ranks) array of one recorded quantity."""
    return np.array([r[key] for r in per_rank], dtype=np.float64).T


# ----------------------------------------------------------------------------- summaries
def summarise(mode: dict, budget: int, card_factor: np.ndarray, fit) -> dict:
    """The table row of one timed mode."""
    compute, wait = grid(mode["per_rank"], "compute_s"), grid(mode["per_rank"], "wait_s")
    tokens, attention = grid(mode["per_rank"], "tokens"), grid(mode["per_rank"], "attention")
    steps = np.arange(len(compute))
    faster = compute.argmin(1)
    faster_wait = wait[steps, faster]
    row = {
        "steps": len(compute),
        "planned_default": step_imbalance(tokens + attention / budget),
        "planned_fitted": None if fit is None else step_imbalance(predicted(fit, tokens, attention)),
        "measured": step_imbalance(compute),
        "measured_card_corrected": step_imbalance(compute / card_factor),
        "faster_wait_median_ms": float(np.median(faster_wait) * 1e3),
        "faster_wait_total_s": float(faster_wait.sum()),
        "faster_wait_share": float(faster_wait.sum() / (compute[steps, faster] + faster_wait).sum()),
        "tokens_per_s": float(tokens.sum() / (compute + wait).max(1).sum()),
        "step_s_median": float(np.median(compute.max(1))),
        "compiles_in_timed_steps": int(grid(mode["per_rank"], "compiles").sum()),
    }
    return row


def predicted(fit, tokens: np.ndarray, attention: np.ndarray) -> np.ndarray:
    """The fitted model's seconds for (steps, ranks) tokens and attention."""
    return np.asarray(fit.predict(tokens.ravel(), attention.ravel()), np.float64).reshape(tokens.shape)


def fit_model(result: dict):
    """The linear + quadratic cost model fitted on every measured (rank, step) point, or None if unavailable."""
    per_rank = [r for mode in [result["calibration"], *result["modes"].values()] for r in mode["per_rank"]]
    points = {
        key: np.concatenate([np.asarray(r[key], np.float64) for r in per_rank])
        for key in ("tokens", "attention", "compute_s")
    }
    try:
        from packing_collators import fit_attention_weight

        return fit_attention_weight(points["tokens"], points["attention"], points["compute_s"]), points
    except (ImportError, ValueError) as error:  # a library without it, or points it cannot fit
        print(f"fit skipped: {error}", flush=True)
        return None


def default_r2(points: dict, budget: int) -> float:
    """r2 of the default cost (tokens + attention / budget), scaled to seconds by least squares (a * cost + b)."""
    cost = points["tokens"] + points["attention"] / budget
    design = np.column_stack([cost, np.ones_like(cost)])
    coef, *_ = np.linalg.lstsq(design, points["compute_s"], rcond=None)
    residual = points["compute_s"] - design @ coef
    total = ((points["compute_s"] - points["compute_s"].mean()) ** 2).sum()
    return float(1 - (residual**2).sum() / total) if total else 1.0


def markdown(result: dict) -> str:
    a = result["args"]
    fit = result.get("fit")
    lines = [
        f"## Rank balance: {a['size']} Llama-style on {result['world_size']}x {result['card']}, {a['attn']}"
        f"{', gradient checkpointing' if a['grad_checkpointing'] else ''}",
        "",
        f"{a['distribution']} lengths (max {a['max_length']}, {a['examples']} examples), {a['tokens_per_batch']} tokens "
        f"per rank per step, plan seed {a['seed']}; per mode {a['warmup']} untimed + {a['steps']} timed steps of "
        "forward + backward (DDP no_sync, no optimizer step). Command: "
        f"`{result['command']}`",
        "",
        "| mode | planned imbalance (default model) | planned (fitted model) | measured step imbalance "
        "| measured, card-corrected | wait of faster rank, median ms | wait share | tokens/s, both ranks (fwd+bwd) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in result["summary"].items():
        fitted = "x" if row["planned_fitted"] is None else f"{row['planned_fitted']:.2%}"
        lines.append(
            f"| {name} | {row['planned_default']:.2%} | {fitted} | {row['measured']:.2%} | "
            f"{row['measured_card_corrected']:.2%} | {row['faster_wait_median_ms']:.1f} | "
            f"{row['faster_wait_share']:.2%} | {row['tokens_per_s']:,.0f} |"
        )
    factors = result["calibration"]["card_factor"]
    lines += [
        "",
        "Imbalance: sum over steps of the slowest rank / sum of the mean rank - 1 (the sampler's `step_imbalance`), "
        "on the timed steps only. Card-corrected: each rank's times divided by its calibration factor.",
        "",
        "Calibration (both ranks on the same "
        f"{len(result['calibration']['per_rank'][0]['compute_s'])} batches): each rank's time / the mean "
        + ", ".join(f"rank {r} {f:.4f}" for r, f in enumerate(factors))
        + f" (slowest / fastest card {max(factors) / min(factors):.4f}).",
    ]
    if fit:
        lines += [
            "",
            f"Fitted cost model on {fit['points']} (rank, step) points: seconds = {fit['per_token']:.4g} * tokens + "
            f"{fit['per_attention']:.4g} * sum(length**2) + {fit['fixed']:.4g}, r2 {fit['r2']:.4f} (the default "
            f"model, scaled to seconds: r2 {fit['default_r2']:.4f}). attention_weight fitted "
            f"{fit['attention_weight']:.4g} vs default 1/{a['tokens_per_batch']} = {1 / a['tokens_per_batch']:.4g} "
            f"({fit['attention_weight'] * a['tokens_per_batch']:.2f}x).",
        ]
    cost, tokens = result["summary"].get("cost"), result["summary"].get("tokens")
    if cost and tokens:
        lines += [
            "",
            f"Bar: balance='cost' measured {cost['measured']:.2%} {'<=' if cost['measured'] <= BAR else '>'} {BAR:.0%}, "
            f"{'below' if cost['measured'] < tokens['measured'] else 'not below'} balance='tokens' "
            f"({tokens['measured']:.2%}).",
        ]
    compiled = {name: row["compiles_in_timed_steps"] for name, row in result["summary"].items()}
    if any(compiled.values()):
        lines += ["", f"FA4 compiles inside timed steps (those steps' times include compiling): {compiled}"]
    return "\n".join(lines) + "\n"


def write(result: dict, args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))


def versions() -> dict:
    found = {"torch": torch.__version__}
    for package in ("transformers", "packing-collators", "flash-attn-cute", "flash-attn", "nvidia-cutlass-dsl"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


# ----------------------------------------------------------------------------- the run
def setup(args) -> tuple[int, torch.device]:
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    if dist.get_world_size() < 2 or dist.get_world_size() != args.replicas:
        raise SystemExit(
            f"rank_balance.py times {args.replicas} ranks (--replicas) waiting on each other, one per process: "
            f"launch it with torchrun --nproc_per_node {max(args.replicas, 2)} (got {dist.get_world_size()})"
        )
    return dist.get_rank(), torch.device("cuda" if cuda else "cpu")


def prepare_model(args, device: torch.device, compiles: CompileCounter):
    """The model, gradient checkpointing on if asked, attention kernels warmed up, wrapped in DDP."""
    from torch.nn.parallel import DistributedDataParallel

    model = build_model(args, args.attn, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    if args.grad_checkpointing:  # before the warm-up: its longest batch then fits at 32k on a 1B model
        options = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x's name; the old one warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    if args.attn == "flash_attention_4" or args.smoke:
        from packing_collators import warm_up_attention

        seconds = warm_up_attention(model, max_length=args.max_length)
        print(f"[rank {dist.get_rank()}] attention warm-up {seconds:.1f}s, {compiles.count} FA4 compiles", flush=True)
    # no buffer broadcast inside the timed forward (newer torch renames the option)
    parameters = inspect.signature(DistributedDataParallel).parameters
    no_sync = {"forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers": False}
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None, **no_sync)


def calibrate(stepper: Stepper, lengths: np.ndarray, args, result: dict) -> float:
    """Both ranks on the same batches; returns the median step seconds (for the runtime estimate)."""
    plan = planner(lengths, args, dist.get_rank(), "cost").plan()
    batches = calibration_batches(plan, lengths, args.calibration_steps)
    calibration = run_steps(stepper, batches[:1] + batches, warmup=1)
    compute = grid(calibration["per_rank"], "compute_s")
    totals = compute.sum(0)
    calibration["card_factor"] = (totals / totals.mean()).tolist()
    result["calibration"] = calibration
    return float(np.median(compute))


def time_mode(stepper: Stepper, lengths: np.ndarray, args, result: dict, mode: str, weight=None) -> None:
    started = time.perf_counter()
    plan = planner(lengths, args, dist.get_rank(), mode, weight).plan()
    count = min(args.warmup + args.steps, plan.num_steps)
    batches = [plan.batch(step, dist.get_rank()) for step in range(count)]
    timed = run_steps(stepper, batches, warmup=min(args.warmup, count - 1))
    timed.update(attention_weight=weight, plan_steps=[min(args.warmup, count - 1), count])
    result["modes"][mode] = timed
    if dist.get_rank() == 0:
        factor = np.array(result["calibration"]["card_factor"])
        row = summarise(timed, args.tokens_per_batch, factor, result.get("fit_object"))
        result["summary"][mode] = row
        print(
            f"{mode:>12}: {row['steps']} steps, planned {row['planned_default']:.2%}, measured {row['measured']:.2%} "
            f"(card-corrected {row['measured_card_corrected']:.2%}), faster rank waits {row['faster_wait_median_ms']:.1f} "
            f"ms ({row['faster_wait_share']:.1%}), {row['tokens_per_s']:,.0f} tokens/s, "
            f"{time.perf_counter() - started:.1f}s",
            flush=True,
        )
        write(public(result), args)


def public(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "fit_object"}


def apply_fit(lengths: np.ndarray, args, result: dict) -> float | None:
    """Fit on rank 0, re-score every mode with it, return the fitted attention_weight on every rank."""
    weight = [None]
    if dist.get_rank() == 0:
        fitted = fit_model(result)
        if fitted is not None:
            fit, points = fitted
            result["fit_object"] = fit
            result["fit"] = {
                "per_token": float(fit.per_token),
                "per_attention": float(fit.per_attention),
                "fixed": float(fit.fixed),
                "attention_weight": float(fit.attention_weight),
                "r2": float(fit.r2),
                "default_r2": default_r2(points, args.tokens_per_batch),
                "points": len(points["tokens"]),
            }
            factor = np.array(result["calibration"]["card_factor"])
            for mode, timed in result["modes"].items():
                result["summary"][mode] = summarise(timed, args.tokens_per_batch, factor, fit)
            f = result["fit"]
            print(
                f"fit: seconds = {f['per_token']:.4g}*tokens + {f['per_attention']:.4g}*attention + {f['fixed']:.4g}, "
                f"r2 {f['r2']:.4f} (default model {f['default_r2']:.4f}); attention_weight {f['attention_weight']:.4g} "
                f"= {f['attention_weight'] * args.tokens_per_batch:.2f}x the default",
                flush=True,
            )
            write(public(result), args)
            weight = [float(fit.attention_weight)]
    dist.broadcast_object_list(weight, src=0)
    if weight[0] is not None and not np.isfinite(weight[0]):  # per_token 0: balance="attention" is the fitted model
        print(f"{FITTED} skipped: fitted attention_weight {weight[0]}; see the attention row", flush=True)
        return None
    return weight[0]


def run(args) -> None:
    rank, device = setup(args)
    began = time.perf_counter()
    compiles = CompileCounter()  # FA4 kernel compiles; a timed step that compiles is flagged
    lengths = lengths_of(args.distribution, args.examples, seed=0, high=args.max_length)
    model = prepare_model(args, device, compiles)
    stepper = Stepper(model, lengths, args, device, compiles)
    result = {
        "name": args.name,
        "world_size": dist.get_world_size(),
        "card": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "command": args.command,
        "versions": versions(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "modes": {},
        "summary": {},
    }
    step_s = calibrate(stepper, lengths, args, result)
    if rank == 0:
        steps = (len(args.balances) + 1) * (args.warmup + args.steps)
        print(
            f"set-up and calibration {time.perf_counter() - began:.0f}s, median step {step_s:.2f}s: "
            f"{steps} more steps, about {steps * step_s:.0f}s",
            flush=True,
        )
    for mode in args.balances:
        time_mode(stepper, lengths, args, result, mode)
    weight = apply_fit(lengths, args, result)
    if weight is not None:
        try:
            time_mode(stepper, lengths, args, result, FITTED, weight)
        except TypeError as error:  # a sampler without attention_weight
            print(f"{FITTED} skipped: {error}", flush=True)
    if rank == 0:
        result["seconds"] = time.perf_counter() - began
        write(public(result), args)
        print("\n" + markdown(result), flush=True)
        print(f"wrote {args.out / args.name}.md and .json", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, steps=16)
    parser.set_defaults(
        size="1b",
        attn="flash_attention_4",
        distribution="long_tail",
        max_length=8192,
        tokens_per_batch=32768,
        warmup=1,
        name=None,
    )
    parser.add_argument("--grad-checkpointing", action="store_true", help="non-reentrant gradient checkpointing")
    parser.add_argument("--balances", default=",".join(BALANCES), help="comma-separated balance modes to time")
    parser.add_argument(
        "--calibration-steps",
        type=int,
        default=6,
        help="batches both ranks run (the cards' speed; part-full points for the fit)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "rank_balance")
    args = finish_run_arguments(parser.parse_args())
    if args.distribution not in DISTRIBUTIONS:
        parser.error(f"--distribution {args.distribution!r}: choose one of {', '.join(DISTRIBUTIONS)}")
    args.balances = args.balances.split(",")
    unknown = set(args.balances) - set(BALANCES)
    if unknown:
        parser.error(f"--balances {sorted(unknown)}: choose from {', '.join(BALANCES)}")
    if args.smoke:
        args.calibration_steps = min(args.calibration_steps, 4)
    if args.name is None:
        args.name = f"{args.distribution}_{args.max_length}" + ("_smoke" if args.smoke else "")
    run(args)


if __name__ == "__main__":
    main()
