"""Multi-GPU training with the multipack sampler: equal steps per rank, the 1-GPU loss curve, scaling.

    torchrun --nproc_per_node 1 benchmarks/gpu/distributed.py --out OUT --name 1gpu   # the reference
    torchrun --nproc_per_node 2 benchmarks/gpu/distributed.py --out OUT --name 2gpu_ddp   # --fsdp: FSDP2
    python benchmarks/gpu/distributed.py --compare OUT      # the table of the runs

CPU check: add ``--smoke`` (gloo, tiny fp32 model, sdpa). Runners (``--runner trainer|loop``), set-ups
(``--setup``, ``--compare-setups``), ``--liger`` and expected times: see docs/benchmarks.md#distributedpy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from packing_collators import FlatteningCollator, MultipackBatchSampler, PackingTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import (  # noqa: E402
    FSDP2,
    SIZES,
    StepClock,
    add_trainer_options,
    build_model,
    gather_ranks,
    loss_gap,
    markov_examples,
    to_device,
    trained,
    training_arguments,
    write_run,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SETUPS = ("ddp", "fsdp", "zero2", "zero3")
SHAPE_8B = (4096, 4, 32, 8, 14336)  # hidden, layers (--layers-8b), heads, kv heads, MLP
VOCAB_8B = 151936


def samplers(lengths, budget: int, replicas: int, seed: int, **options) -> list[MultipackBatchSampler]:
    """One sampler per rank of a ``replicas``-rank plan."""
    return [
        MultipackBatchSampler(lengths, budget, seed=seed, num_replicas=replicas, rank=r, **options)
        for r in range(replicas)
    ]


def result(args, world: int, cuda: bool, gathered, loss, stats, **extra) -> dict:
    """The shared schema from [tokens, seconds, forward seconds, steps] per rank."""
    return {
        "name": args.name,
        "world_size": world,
        "replicas": args.replicas,
        "fsdp": args.setup == "fsdp",
        "card": torch.cuda.get_device_name() if cuda else "cpu",
        "steps_per_rank": [int(g[3]) for g in gathered],
        "loss": loss,
        "real_tokens_per_s": sum(float(g[0]) for g in gathered) / max(float(g[1]) for g in gathered),
        "forward_time_per_process_s": [float(g[2]) for g in gathered],
        "sampler_stats": {
            k: (float(v) if isinstance(v, (int, float, np.number)) else str(v)) for k, v in stats.items()
        },
        "command": args.command,
        **extra,
    }


def wrap(model, args, device):
    if dist.get_world_size() == 1:
        return model
    if args.setup == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def run_loop(args, rank: int, world: int, cuda: bool) -> dict | None:
    device = torch.device("cuda" if cuda else "cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    lengths, examples = markov_examples(args)
    plan = samplers(lengths, args.tokens_per_batch, args.replicas, args.seed)
    mine = [r for r in range(args.replicas) if r % world == rank]  # the sampler ranks this process trains
    plans = [list(s) for s in plan]
    steps, collate = min(args.steps, len(plans[0])), FlatteningCollator()
    model = wrap(build_model(args, args.attn, device, torch.bfloat16 if cuda else torch.float32), args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, **({"fused": True} if cuda else {}))
    losses, step_times, forward, tokens = [], [], 0.0, 0
    for step in range(steps):
        global_items = sum(int(lengths[plans[r][step]].sum()) - len(plans[r][step]) for r in range(args.replicas))
        dist.barrier()
        start, local_loss = time.perf_counter(), torch.zeros((), device=device)
        for r in mine:
            batch = to_device(collate([examples[i] for i in plans[r][step]]), device)
            t0 = time.perf_counter()
            loss = model(**batch, num_items_in_batch=global_items).loss
            if cuda:
                torch.cuda.synchronize()
            forward += time.perf_counter() - t0 if step >= args.warmup else 0.0
            (loss * world).backward()
            local_loss += loss.detach()
            tokens += int(lengths[plans[r][step]].sum()) if step >= args.warmup else 0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(local_loss)
        if cuda:
            torch.cuda.synchronize()
        if step >= args.warmup:
            step_times.append(time.perf_counter() - start)
        losses.append(float(local_loss))
    gathered = gather_ranks([tokens, sum(step_times), forward, steps], world, device)
    tokens_all = sum(float(g[0]) for g in gathered)
    del model, optimizer  # before the group goes: DDP's teardown after it could hang on gloo
    dist.destroy_process_group()
    if rank == 0:
        out = result(args, world, cuda, gathered, losses, plan[0].stats(), step_time_s=float(np.median(step_times)))
        return {**out, "real_tokens_per_s": tokens_all / sum(step_times)}  # rank 0's timed window, as before


class AllRanks:
    """One process, every rank's batches of a `replicas`-rank plan: step by step, rank 0 first."""

    def __init__(self, samplers: list[MultipackBatchSampler]):
        self.samplers = samplers

    def set_epoch(self, epoch: int) -> None:
        for sampler in self.samplers:
            sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.samplers) * len(self.samplers[0])

    def __iter__(self):
        for step in zip(*self.samplers):
            yield from step


class ReplayTrainer(PackingTrainer):
    """PackingTrainer whose one process trains the batches of all `replicas` ranks."""

    replicas = 2

    def make_batch_sampler(self, lengths, max_tokens_per_batch, *, shuffle):
        return AllRanks(samplers(lengths, max_tokens_per_batch, self.replicas, self.args.seed, shuffle=shuffle))


def _setup_options(setup: str) -> dict:
    if setup in ("zero2", "zero3"):  # the config as users write it: TrainingArguments fills every "auto"
        return dict(deepspeed=json.loads((EXAMPLES / f"ds_{setup}.json").read_text()))
    return FSDP2 if setup == "fsdp" else {}


def _trainer(args, cuda: bool, examples, tokens: int, dtype, trainer_class=PackingTrainer, **options):
    """A PackingTrainer of ``args.size`` with a StepClock; TrainingArguments first: ZeRO-3 sees them."""
    training_args = training_arguments(
        args, cuda, logging_steps=args.logging_steps, dataloader_num_workers=args.workers, **options
    )
    model = build_model(args, args.attn, torch.device("cuda" if cuda else "cpu"), dtype)
    clock = StepClock(cuda, model)  # PackingTrainer compiles FA4's kernel variants itself (attention_warm_up)
    trainer = trainer_class(
        model=model,
        args=training_args,
        train_dataset=examples,
        max_tokens_per_batch=tokens,
        attn_implementation=None,
    )  # keep --attn
    trainer.add_callback(clock.callback())
    return trainer, clock


def run_trainer(args, rank: int, world: int, cuda: bool) -> dict | None:
    lengths, examples = markov_examples(args)
    accumulation = args.replicas // world
    trainer_class = PackingTrainer
    if world == 1 and args.replicas > 1:
        trainer_class = type("ReplayTrainer", (ReplayTrainer,), {"replicas": args.replicas})
    mixed = cuda and args.mixed_precision
    dtype = torch.bfloat16 if cuda and not mixed else torch.float32
    options = dict(gradient_accumulation_steps=accumulation, bf16=mixed, **_setup_options(args.setup))
    trainer, clock = _trainer(args, cuda, examples, args.tokens_per_batch, dtype, trainer_class, **options)
    run = trained(trainer, clock, lengths, args.warmup, accumulation)
    numbers = [run["tokens"], run["seconds"], run["forward_seconds"], run["steps"], run["peak_gib"]]
    gathered = gather_ranks(numbers, world, trainer.args.device)
    if rank != 0:
        return None
    # rank 0's sampler alone, so no collective
    plan = samplers(lengths, args.tokens_per_batch, args.replicas, args.seed, check_ranks=False)[0]
    probe, callbacks = run["probe"], trainer.callback_handler.callbacks
    return result(
        args,
        world,
        cuda,
        gathered,
        run["loss"],
        plan.stats(),
        setup=args.setup,
        peak_gib_per_rank=[round(float(g[4]), 2) for g in gathered],
        size=args.size,
        tokens_per_batch=args.tokens_per_batch,
        probe=probe.summary() if probe else None,
        probe_seconds=probe.seconds if probe else None,
        attention_warm_up_seconds=next((c.seconds for c in callbacks if type(c).__name__ == "_AttentionWarmUp"), None),
        runner="PackingTrainer",
        wrapped_as=type(trainer.model_wrapped).__name__,
        accelerate_distributed_type=str(trainer.accelerator.distributed_type),
        step_time_s=float(np.median(np.diff(clock.ends[args.warmup - 1 :]))),
        step_seconds=np.diff(clock.ends).round(4).tolist(),  # where a stall sits
    )


def _budget(args, shape: str, liger: bool) -> dict:
    """measure_token_budget on a fresh model of ``shape`` ("1b" or "8b_like"), bf16 weights, unfused or fused."""
    from packing_collators import measure_token_budget

    dims = SIZES["1b"] if shape == "1b" else (SHAPE_8B[0], args.layers_8b, *SHAPE_8B[2:])
    vocab = args.vocab if shape == "1b" else VOCAB_8B
    shaped = argparse.Namespace(**{**vars(args), "vocab": vocab, "max_length": args.longest})
    model = build_model(shaped, "packing_varlen", torch.device("cuda"), torch.bfloat16, dims)
    if liger:  # Liger's fused linear cross-entropy on this instance only (its other patches are module-wide)
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(
            rope=False, rms_norm=False, swiglu=False, fused_linear_cross_entropy=True, model=model
        )
    started = time.perf_counter()
    try:
        budget = measure_token_budget(model, longest=args.longest)
        row = {"max_tokens_per_batch": budget.max_tokens_per_batch, "summary": budget.summary()}
    except ValueError as refused:  # one example of --longest does not fit
        row = {"max_tokens_per_batch": 0, "summary": str(refused)}
    row.update(shape=shape, liger=liger, layers=dims[1], hidden=dims[0], vocab=vocab)
    row.update(parameters=sum(p.numel() for p in model.parameters()), seconds=round(time.perf_counter() - started, 1))
    del model
    torch.cuda.empty_cache()
    print(json.dumps(row))
    return row


def _liger_training(args, dataset, lengths, liger: bool) -> dict:
    shaped = argparse.Namespace(**{**vars(args), "size": "1b", "attn": "packing_varlen"})
    trainer, clock = _trainer(
        shaped, True, dataset, args.liger_tokens, torch.float32, bf16=True, use_liger_kernel=liger
    )
    torch.cuda.reset_peak_memory_stats()
    result = trained(trainer, clock, lengths, args.warmup)
    del result["forward_seconds"]  # as the set-ups runs wrote it
    result["probe"] = result["probe"].summary() if result["probe"] else None
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    model = trainer.model
    result["forward"] = f"{type(model).forward.__module__} / instance: {getattr(model.forward, '__module__', '')}"
    del trainer, model
    torch.cuda.empty_cache()
    return result


def run_liger(args) -> None:
    """1 GPU: the token budget without and with the fused loss, then training unfused vs use_liger_kernel=True."""
    if not torch.cuda.is_available():
        raise SystemExit("--liger needs a CUDA GPU (Liger's kernels are Triton).")
    budgets = [_budget(args, shape, liger) for shape in ("1b", "8b_like") for liger in (False, True)]
    lengths, dataset = markov_examples(args)
    plain = _liger_training(args, dataset, lengths, liger=False)
    fused = _liger_training(args, dataset, lengths, liger=True)  # last: use_liger_kernel patches modules process-wide
    difference = loss_gap(fused["loss"], plain["loss"])
    result = {
        "card": torch.cuda.get_device_name(),
        "budgets": budgets,
        "training": {"unfused": plain, "liger": fused},
        "loss_max_relative_difference": difference,
        "loss_within_tolerance": difference <= args.tolerance,
        "tolerance": args.tolerance,
        "tokens_per_s": {"unfused": plain["tokens_per_s"], "liger": fused["tokens_per_s"]},
        "command": " ".join(["python", *sys.argv]),
    }
    write_run(args.out, "liger", result)


def compare_setups(out: Path, tolerance: float) -> None:
    """One table: each set-up's tokens/s and its per-step losses against DDP's."""
    runs = {s: json.loads((out / f"{s}.json").read_text()) for s in SETUPS if (out / f"{s}.json").exists()}
    if "ddp" not in runs:
        raise SystemExit(f"{out}/ddp.json is missing: run --setup ddp --name ddp first")
    ddp = runs["ddp"]
    lines = [
        "| set-up | wrapped as | tokens/s | vs DDP | max rel. loss diff vs DDP | within bf16 noise | peak GiB/rank |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    summary = {}
    for name, run in runs.items():
        diff = loss_gap(run["loss"], ddp["loss"])
        ratio = run["real_tokens_per_s"] / ddp["real_tokens_per_s"]
        summary[name] = {
            "max_relative_loss_diff_vs_ddp": diff,
            "within_tolerance": diff <= tolerance,
            "real_tokens_per_s": run["real_tokens_per_s"],
            "vs_ddp": ratio,
        }
        lines.append(
            f"| {name} | {run['wrapped_as']} | {run['real_tokens_per_s']:,.0f} | {ratio:.2f} | {diff:.4f} | "
            f"{'yes' if diff <= tolerance else 'NO'} (<= {tolerance}) | {run['peak_gib_per_rank']} |"
        )
    text = f"{ddp['card']} x{ddp['world_size']}, {ddp['size']}, {ddp['tokens_per_batch']} tokens/micro-batch\n\n"
    text += "\n".join(lines) + "\n"
    (out / "setups.md").write_text(text)
    (out / "setups.json").write_text(
        json.dumps({"card": ddp["card"], "tolerance": tolerance, "runs": summary}, indent=1)
    )
    print(text)


def compare(folder: Path) -> None:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    base = next((r for r in runs.values() if r["world_size"] == 1), None)
    first = next(iter(runs.values()))
    lines = [
        f"## Multi-GPU training with the multipack sampler: {first.get('runner', 'a hand-written loop')}",
        "",
        f"Card: {first['card']}. Commands: " + "; ".join(f"`{r['command']}`" for r in runs.values()),
        "",
        "| run | processes | steps per rank | real tokens/s | scaling vs 1 GPU | median step (s) | forward time per process (s) | max loss diff vs 1 GPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        scale = r["real_tokens_per_s"] / base["real_tokens_per_s"] if base else float("nan")
        diff = np.abs(np.array(r["loss"]) - np.array(base["loss"])).max() if base else float("nan")
        fwd = ", ".join(f"{f:.2f}" for f in r["forward_time_per_process_s"])
        lines.append(
            f"| {name} | {r['world_size']} | {r['steps_per_rank']} | {r['real_tokens_per_s']:,.0f} | "
            f"{scale:.2f}x | {r['step_time_s']:.3f} | {fwd} | {diff:.4f} |"
        )
    lines += [
        "",
        "Sampler plan (same on every run): " + ", ".join(f"{k} {v}" for k, v in first["sampler_stats"].items()),
    ]
    text = "\n".join(lines) + "\n"
    (folder / "distributed_scaling.md").write_text(text)
    print(text)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--runner", choices=("trainer", "loop"), default="trainer", help="PackingTrainer (30 --steps) or a loop (40)")
    add("--out", type=Path)
    add("--compare", type=Path, help="write the scaling table from the runs in this folder")
    add("--compare-setups", type=Path, help="write setups.md/.json from the --setup runs in this folder")
    add("--setup", choices=SETUPS, default="ddp", help="what wraps the model (loop: ddp or fsdp)")
    add("--fsdp", action="store_const", const="fsdp", dest="setup", help="--setup fsdp")
    add("--mixed-precision", action="store_true", help="float32 weights, TrainingArguments(bf16=True)")
    add("--liger", action="store_true", help="the 1-GPU Liger measurements (OUT/liger.json)")
    add("--name", default="run")
    add("--replicas", type=int, default=2, help="ranks the sampler plans for")
    add_trainer_options(parser, examples=20000, steps=None, warmup=5)
    add("--workers", type=int, default=2, help="DataLoader workers per rank (trainer)")
    add("--logging-steps", type=int, default=1, help="trainer: 1 syncs every step; 10 is closer to a real run")
    add("--tolerance", type=float, default=0.02, help="max relative loss difference per step counted as bf16 noise")
    add("--longest", type=int, default=4096, help="--liger: the longest example of the budget")
    add("--liger-tokens", type=int, default=8192, help="--liger: tokens per micro-batch of the 1B runs")
    add("--layers-8b", type=int, default=4, help="--liger: layers of the 8B-like shape (32 in 8B)")
    args = parser.parse_args(argv)
    args.command = f"torchrun --nproc_per_node {os.environ.get('WORLD_SIZE', 1)} " + " ".join(sys.argv)
    args.steps = args.steps or (30 if args.runner == "trainer" else 40)
    if args.smoke:
        args.size, args.vocab, args.attn, args.examples, args.steps, args.warmup = "tiny", 128, "sdpa", 2000, 4, 1
        args.tokens_per_batch, args.max_length, args.workers = 1024, 256, 0
    return args


def main() -> None:
    args = parse_args()
    if args.compare or args.compare_setups:
        return compare(args.compare) if args.compare else compare_setups(args.compare_setups, args.tolerance)
    if args.liger:
        return run_liger(args)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.replicas % world:
        raise SystemExit(f"--replicas {args.replicas} must be a multiple of the {world} processes")
    cuda = torch.cuda.is_available() and not args.smoke
    if args.setup.startswith("zero") and (not cuda or args.runner == "loop"):
        raise SystemExit("DeepSpeed set-ups need CUDA GPUs and --runner trainer (--setup ddp or fsdp on the CPU).")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    out = (run_trainer if args.runner == "trainer" else run_loop)(args, rank, world, cuda)
    if out is not None:
        write_run(args.out, args.name, out)


if __name__ == "__main__":
    main()
