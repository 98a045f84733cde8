"""PackingTrainer on 1 and 2 GPUs: equal steps per rank, the 1-GPU loss curve, scaling.

The distributed recipe of the README run as written: ``PackingTrainer`` (its own
MultipackBatchSampler, FlatteningCollator, the ``packing_varlen`` backend), launched by
torchrun, DDP or FSDP2 through the Trainer's own options. The model is the shared Llama-style
config (``_shared.build_model``, random weights, bf16) on Markov-chain tokens with
`--distribution` lengths.

    torchrun --nproc_per_node 2 benchmarks/gpu/trainer_scaling.py --out OUT --name 2gpu_ddp
    torchrun --nproc_per_node 2 benchmarks/gpu/trainer_scaling.py --out OUT --name 2gpu_fsdp --fsdp
    torchrun --nproc_per_node 1 benchmarks/gpu/trainer_scaling.py --out OUT --name 1gpu   # the reference

The 1-process reference replays the 2-rank plan (`--replicas 2`): through
``PackingTrainer.make_batch_sampler`` it trains rank 0's then rank 1's micro-batch each
step with gradient accumulation 2, so every optimizer step sees the same examples as the
2-GPU run and the logged losses must agree within bf16 noise.

Per run it records each rank's optimizer steps, the logged loss per step, real tokens/s
over the timed steps (after `--warmup`), each rank's forward GPU time (CUDA events around
the model's forward, no extra syncs) next to the sampler's planned imbalance. The JSON has
distributed_scaling.py's schema: `python benchmarks/gpu/distributed_scaling.py --compare OUT` tables
and plots it.
CPU check: add --smoke (gloo, tiny fp32 model, sdpa).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from packing_collators import MultipackBatchSampler, PackingTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import add_run_arguments, build_model, finish_run_arguments, lengths_of, markov_tokens  # noqa: E402


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
        return AllRanks(
            [
                MultipackBatchSampler(
                    lengths,
                    self.token_budget(lengths, batch_size),
                    shuffle=shuffle,
                    seed=self.args.seed,
                    num_replicas=self.replicas,
                    rank=r,
                )
                for r in range(self.replicas)
            ]
        )


class Clock:
    """Wall time at each optimizer step's end (after a sync) and GPU time of each forward."""

    def __init__(self, model, cuda: bool):
        self.cuda, self.step_ends, self.forwards, self.pending = cuda, [], [], None
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after)

    def _before(self, module, args):
        if self.cuda:
            self.pending = torch.cuda.Event(enable_timing=True)
            self.pending.record()
        else:
            self.pending = time.perf_counter()

    def _after(self, module, args, output):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.forwards.append((self.pending, end))
        else:
            self.forwards.append(time.perf_counter() - self.pending)

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class StepEnd(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if clock.cuda:
                    torch.cuda.synchronize()
                clock.step_ends.append((time.perf_counter(), len(clock.forwards)))

        return StepEnd()

    def forward_seconds(self, first: int, last: int) -> float:
        spans = self.forwards[first:last]
        return sum(a.elapsed_time(b) / 1e3 for a, b in spans) if self.cuda else sum(spans)


def run(args) -> None:
    from transformers import TrainingArguments

    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    if args.replicas % world:
        raise SystemExit(f"--replicas {args.replicas} must be a multiple of the {world} processes")
    cuda = torch.cuda.is_available() and not args.smoke
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda" if cuda else "cpu")
    lengths = np.minimum(lengths_of(args.distribution, args.examples, seed=0), args.max_length)
    dataset = [{"input_ids": e} for e in markov_tokens(lengths, args.vocab, seed=0)]
    model = build_model(args, args.attn, device, torch.bfloat16 if cuda else torch.float32)
    # PackingTrainer compiles FA4's kernel variants itself when training begins (attention_warm_up)
    clock = Clock(model, cuda)
    accumulation = args.replicas // world
    options = dict(
        output_dir=tempfile.mkdtemp(prefix="trainer_scaling_"),
        max_steps=args.warmup + args.steps,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=accumulation,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        optim="adamw_torch_fused" if cuda else "adamw_torch",
        use_cpu=not cuda,
        disable_tqdm=True,
        dataloader_num_workers=args.workers,
        dataloader_pin_memory=cuda,
        ddp_broadcast_buffers=False,
        ddp_find_unused_parameters=False,
    )
    if args.fsdp:
        options.update(
            fsdp="full_shard auto_wrap",
            fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
        )
    trainer_class = PackingTrainer
    if world == 1 and args.replicas > 1:
        trainer_class = type("ReplayTrainer", (ReplayTrainer,), {"replicas": args.replicas})
    trainer = trainer_class(
        model=model,
        args=TrainingArguments(**options),
        train_dataset=dataset,
        max_tokens_per_batch=args.tokens_per_batch,
        attn_implementation=None,
    )  # keep --attn
    trainer.add_callback(clock.callback())
    trainer.train()

    sampler = trainer._train_batch_sampler
    probe = next((c.last_report for c in trainer.callback_handler.callbacks if getattr(c, "last_report", None)), None)
    batches = list(sampler)[: (args.warmup + args.steps) * accumulation]
    timed = batches[args.warmup * accumulation :]
    (start, first), (end, last) = clock.step_ends[args.warmup - 1], clock.step_ends[-1]
    local = torch.tensor(
        [
            float(sum(int(lengths[b].sum()) for b in timed)),
            end - start,
            clock.forward_seconds(first, last),
            trainer.state.global_step,
        ],
        dtype=torch.float64,
    )
    gathered = [local]
    if world > 1:
        import torch.distributed as dist

        local = local.to(device)
        gathered = [torch.zeros_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        gathered = [g.cpu() for g in gathered]
    if rank != 0:
        return
    plan = MultipackBatchSampler(
        lengths, args.tokens_per_batch, seed=args.seed, num_replicas=args.replicas, rank=0, check_ranks=False
    )  # rank 0 alone: no collective
    seconds = max(float(g[1]) for g in gathered)
    result = {
        "probe": probe.summary() if probe else None,
        "probe_seconds": probe.seconds if probe else None,
        "attention_warm_up_seconds": next(
            (c.seconds for c in trainer.callback_handler.callbacks if type(c).__name__ == "_AttentionWarmUp"), None
        ),
        "name": args.name,
        "world_size": world,
        "replicas": args.replicas,
        "fsdp": args.fsdp,
        "card": torch.cuda.get_device_name() if cuda else "cpu",
        "runner": "PackingTrainer",
        "wrapped_as": type(trainer.model_wrapped).__name__,
        "accelerate_distributed_type": str(trainer.accelerator.distributed_type),
        "steps_per_rank": [int(g[3]) for g in gathered],
        "loss": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "real_tokens_per_s": sum(float(g[0]) for g in gathered) / seconds,
        "step_time_s": float(np.median(np.diff([t for t, _ in clock.step_ends[args.warmup - 1 :]]))),
        "step_seconds": np.diff([t for t, _ in clock.step_ends]).round(4).tolist(),  # where a stall sits
        "forward_time_per_process_s": [float(g[2]) for g in gathered],
        "sampler_stats": {
            k: (float(v) if isinstance(v, (int, float, np.number)) else str(v)) for k, v in plan.stats().items()
        },
        "command": args.command,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "loss"}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 through TrainingArguments(fsdp=...) instead of DDP")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument(
        "--logging-steps", type=int, default=1, help="1 logs every loss (a sync per step); 10 is closer to a real run"
    )
    add_run_arguments(parser, steps=30)
    args = finish_run_arguments(parser.parse_args())
    if args.smoke:
        args.workers = 0
    run(args)


if __name__ == "__main__":
    main()
