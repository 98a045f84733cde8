"""Multi-GPU training with the multipack sampler: equal steps per rank, the 1-GPU loss curve, scaling.

Two runners of one plan, the same model (``_shared.build_model``: Llama-style, random weights,
bf16), Markov-chain tokens of ``--distribution`` lengths and JSON schema:

- ``--runner trainer`` (default): ``PackingTrainer`` as a user runs it (its own
  MultipackBatchSampler, FlatteningCollator, DDP or FSDP2 through ``TrainingArguments``).
  Formerly ``gpu/trainer_scaling.py``.
- ``--runner loop``: a hand-written loop (sampler + DDP or ``fully_shard`` per decoder layer).
  Loss is token-weighted over the global step (``num_items_in_batch`` = label tokens of all
  ranks, known from the plan on every rank without communication), times the world size to undo
  DDP's gradient averaging. Formerly ``gpu/distributed_scaling.py``.

The sampler plans each epoch for ``--replicas`` ranks (default 2). Launched on ONE process, a
run trains the batches of all ranks per optimizer step (rank 0's first; gradient accumulation),
so every step sees the same examples as the N-GPU run and the losses must agree within bf16
noise. Per run: each rank's steps, the loss per step, real tokens/s over the timed steps (after
``--warmup``), each rank's forward time next to the sampler's planned imbalance.

    torchrun --nproc_per_node 1 benchmarks/gpu/distributed.py --out OUT --name 1gpu   # the reference
    torchrun --nproc_per_node 2 benchmarks/gpu/distributed.py --out OUT --name 2gpu_ddp
    torchrun --nproc_per_node 2 benchmarks/gpu/distributed.py --out OUT --name 2gpu_fsdp --fsdp
    python benchmarks/gpu/distributed.py --compare OUT      # table + plot from the runs

(add ``--runner loop`` to each for the hand-written loop). CPU check: add ``--smoke`` (gloo, tiny
fp32 model, sdpa).
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
    StepClock,
    add_trainer_options,
    build_model,
    gather_ranks,
    markov_examples,
    to_device,
    trained,
    training_arguments,
    write_run,
)


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
        "fsdp": args.fsdp,
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
    if args.fsdp:
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

    def make_batch_sampler(self, lengths, batch_size, *, shuffle):
        budget = self.token_budget(lengths, batch_size)
        return AllRanks(samplers(lengths, budget, self.replicas, self.args.seed, shuffle=shuffle))


def run_trainer(args, rank: int, world: int, cuda: bool) -> dict | None:
    device = torch.device("cuda" if cuda else "cpu")
    lengths, examples = markov_examples(args)
    model = build_model(args, args.attn, device, torch.bfloat16 if cuda else torch.float32)
    clock = StepClock(cuda, model)  # PackingTrainer compiles FA4's kernel variants itself (attention_warm_up)
    accumulation = args.replicas // world
    trainer_class = PackingTrainer
    if world == 1 and args.replicas > 1:
        trainer_class = type("ReplayTrainer", (ReplayTrainer,), {"replicas": args.replicas})
    options = dict(gradient_accumulation_steps=accumulation, dataloader_num_workers=args.workers)
    trainer = trainer_class(
        model=model,
        args=training_arguments(
            args, cuda, logging_steps=args.logging_steps, **options, **(FSDP2 if args.fsdp else {})
        ),
        train_dataset=examples,
        max_tokens_per_batch=args.tokens_per_batch,
        attn_implementation=None,
    )  # keep --attn
    trainer.add_callback(clock.callback())
    run = trained(trainer, clock, lengths, args.warmup, accumulation)
    gathered = gather_ranks([run["tokens"], run["seconds"], run["forward_seconds"], run["steps"]], world, device)
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
        probe=probe.summary() if probe else None,
        probe_seconds=probe.seconds if probe else None,
        attention_warm_up_seconds=next((c.seconds for c in callbacks if type(c).__name__ == "_AttentionWarmUp"), None),
        runner="PackingTrainer",
        wrapped_as=type(trainer.model_wrapped).__name__,
        accelerate_distributed_type=str(trainer.accelerator.distributed_type),
        step_time_s=float(np.median(np.diff(clock.ends[args.warmup - 1 :]))),
        step_seconds=np.diff(clock.ends).round(4).tolist(),  # where a stall sits
    )


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
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        for name, r in runs.items():
            plt.plot(r["loss"], label=name)
        plt.xlabel("step"), plt.ylabel("training loss"), plt.legend()
        plt.savefig(folder / "distributed_scaling.png", dpi=90)
    except ImportError:
        pass


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--runner",
        choices=("trainer", "loop"),
        default="trainer",
        help="PackingTrainer (30 --steps by default) or a loop (40)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path, help="write the table and plot from the runs in this folder")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 instead of DDP")
    parser.add_argument("--name", default="run")
    parser.add_argument("--replicas", type=int, default=2, help="ranks the sampler plans for")
    add_trainer_options(parser, examples=20000, steps=None, warmup=5)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (trainer)")
    parser.add_argument(
        "--logging-steps", type=int, default=1, help="trainer: 1 syncs every step; 10 is closer to a real run"
    )
    args = parser.parse_args(argv)
    args.command = f"torchrun --nproc_per_node {os.environ.get('WORLD_SIZE', 1)} " + " ".join(sys.argv)
    args.steps = args.steps or (30 if args.runner == "trainer" else 40)
    if args.smoke:
        args.size, args.vocab, args.attn, args.examples, args.steps, args.warmup = "tiny", 128, "sdpa", 2000, 4, 1
        args.tokens_per_batch, args.max_length, args.workers = 1024, 256, 0
    return args


def main() -> None:
    args = parse_args()
    if args.compare:
        return compare(args.compare)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.replicas % world:
        raise SystemExit(f"--replicas {args.replicas} must be a multiple of the {world} processes")
    cuda = torch.cuda.is_available() and not args.smoke
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    out = (run_trainer if args.runner == "trainer" else run_loop)(args, rank, world, cuda)
    if out is not None:
        write_run(args.out, args.name, out)


if __name__ == "__main__":
    main()
