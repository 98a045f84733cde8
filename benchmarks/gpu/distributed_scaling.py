"""Multi-GPU training with MultipackBatchSampler: equal steps, same loss as one GPU, scaling.

The sampler plans each epoch for `--replicas` ranks (default 2). Launched on that many
processes, rank r trains on the sampler's rank-r batches (DDP or FSDP2). Launched on ONE
process, the same run accumulates the batches of all `--replicas` ranks per optimizer step,
so both see the same examples per step and the loss curves must agree (within bf16 noise).
Loss is token-weighted over the global step (`num_items_in_batch` = label tokens of all ranks,
known from the plan on every rank without communication), times the world size to undo
DDP's gradient averaging.

Per rank it records the steps taken, forward times (no communication happens in the forward,
so they show the compute imbalance) and the sampler's planned cost imbalance.

Usage (one host):
  torchrun --nproc_per_node 1 benchmarks/gpu/distributed_scaling.py --out OUT --name 1gpu
  torchrun --nproc_per_node 2 benchmarks/gpu/distributed_scaling.py --out OUT --name 2gpu_ddp
  torchrun --nproc_per_node 2 benchmarks/gpu/distributed_scaling.py --out OUT --name 2gpu_fsdp --fsdp
  python benchmarks/gpu/distributed_scaling.py --compare OUT      # table + plot from the runs
CPU check: add --smoke (gloo, tiny fp32 model, sdpa).
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

from packing_collators import FlatteningCollator, MultipackBatchSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import add_run_arguments, build_model, finish_run_arguments, lengths_of, markov_tokens, to_device  # noqa: E402


def setup() -> tuple[int, int, torch.device]:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    return rank, world, torch.device("cuda" if cuda else "cpu")


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


def run(args) -> None:
    rank, world, device = setup()
    if args.replicas % world:
        raise SystemExit(f"--replicas {args.replicas} must be a multiple of the {world} processes")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = np.minimum(lengths_of(args.distribution, args.examples, seed=0), args.max_length)
    examples = markov_tokens(lengths, args.vocab, seed=0)
    samplers = [
        MultipackBatchSampler(lengths, args.tokens_per_batch, seed=0, num_replicas=args.replicas, rank=r)
        for r in range(args.replicas)
    ]
    mine = [r for r in range(args.replicas) if r % world == rank]  # the sampler ranks this process trains
    plans = [list(s) for s in samplers]
    steps = min(args.steps, len(plans[0]))
    collate = FlatteningCollator()
    model = wrap(build_model(args, args.attn, device, dtype), args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, **({"fused": True} if device.type == "cuda" else {}))
    losses, step_times, forward_times, tokens = [], [], [], 0
    for step in range(steps):
        global_items = sum(int(lengths[plans[r][step]].sum()) - len(plans[r][step]) for r in range(args.replicas))
        dist.barrier()
        start = time.perf_counter()
        local_loss, forward = torch.zeros((), device=device), 0.0
        for r in mine:
            batch = to_device(collate([{"input_ids": examples[i]} for i in plans[r][step]]), device)
            t0 = time.perf_counter()
            loss = model(**batch, num_items_in_batch=global_items).loss
            if device.type == "cuda":
                torch.cuda.synchronize()
            forward += time.perf_counter() - t0
            (loss * world).backward()
            local_loss += loss.detach()
            tokens += int(lengths[plans[r][step]].sum()) if step >= args.warmup else 0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(local_loss)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            step_times.append(time.perf_counter() - start)
            forward_times.append(forward)
        losses.append(float(local_loss))
    counts = torch.tensor([steps], device=device)
    gathered = [torch.zeros_like(counts) for _ in range(world)]
    dist.all_gather(gathered, counts)
    fwd = torch.tensor([sum(forward_times)], device=device, dtype=torch.float64)
    fwd_all = [torch.zeros_like(fwd) for _ in range(world)]
    dist.all_gather(fwd_all, fwd)
    tok = torch.tensor([tokens], device=device, dtype=torch.float64)
    dist.all_reduce(tok)
    if rank == 0:
        stats = samplers[0].stats()
        result = {
            "name": args.name,
            "world_size": world,
            "replicas": args.replicas,
            "fsdp": args.fsdp,
            "card": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "steps_per_rank": [int(c) for c in gathered],
            "loss": losses,
            "real_tokens_per_s": float(tok) / sum(step_times),
            "step_time_s": float(np.median(step_times)),
            "forward_time_per_process_s": [float(f) for f in fwd_all],
            "sampler_stats": {
                k: (float(v) if isinstance(v, (int, float, np.number)) else str(v)) for k, v in stats.items()
            },
            "command": args.command,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({k: v for k, v in result.items() if k != "loss"}, indent=1))
    dist.destroy_process_group()


def compare(folder: Path) -> None:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    base = next((r for r in runs.values() if r["world_size"] == 1), None)
    runner = next(iter(runs.values())).get("runner", "a hand-written loop (distributed_scaling.py)")
    lines = [
        f"## Multi-GPU training with the multipack sampler: {runner}",
        "",
        f"Card: {next(iter(runs.values()))['card']}. Commands: "
        + "; ".join(f"`{r['command']}`" for r in runs.values()),
        "",
        "| run | processes | steps per rank | real tokens/s | scaling vs 1 GPU | median step (s) | forward time per process (s) | max loss diff vs 1 GPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        scale = r["real_tokens_per_s"] / base["real_tokens_per_s"] if base else float("nan")
        diff = np.abs(np.array(r["loss"]) - np.array(base["loss"])).max() if base else float("nan")
        fwd = ", ".join(f"{f:.2f}" for f in r["forward_time_per_process_s"])
        lines.append(
            f"| {name} | {r['world_size']} | {r['steps_per_rank']} | {r['real_tokens_per_s']:,.0f} | {scale:.2f}x | "
            f"{r['step_time_s']:.3f} | {fwd} | {diff:.4f} |"
        )
    s = next(iter(runs.values()))["sampler_stats"]
    lines += ["", "Sampler plan (same on every run): " + ", ".join(f"{k} {v}" for k, v in s.items())]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path, help="write the table and plot from the runs in this folder")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard per decoder layer) instead of DDP")
    add_run_arguments(parser, steps=40)
    args = parser.parse_args()
    if args.compare:
        return compare(args.compare)
    run(finish_run_arguments(args))


if __name__ == "__main__":
    main()
