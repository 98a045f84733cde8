"""PackingTrainer under the set-ups users train with: DDP, FSDP2, DeepSpeed ZeRO-2/3 on 2 GPUs; Liger on 1.

2 GPUs, one launch per set-up (same model, data, seed and token budget; bf16 mixed precision:
float32 weights, ``TrainingArguments(bf16=True)``, ``packing_varlen``), then one table::

    for s in ddp fsdp zero2 zero3; do
      timeout 150 torchrun --nproc-per-node 2 benchmarks/gpu/trainer_setups.py --out OUT --setup $s
    done                                                # ~40 s each (start-up, plan, 3 + 15 steps)
    python benchmarks/gpu/trainer_setups.py --out OUT --compare

Each records the logged loss of every step, real tokens/s over the timed steps (the two
ranks' tokens / the slower rank's time), the peak memory per rank, the probe's line (it runs
on every rank, under ZeRO-3 on partitioned weights) and what the model was wrapped in.
ZeRO runs read examples/ds_zero2.json / ds_zero3.json (every batch number "auto").
``--compare`` sets each run's per-step losses beside DDP's (max |difference|, and whether it
is within ``--tolerance``, 2% relative by default: bf16 noise) and their tokens/s in one table (``setups.md``).

1 GPU, Liger Kernel's fused linear cross-entropy (``--liger``, ~2-3 min)::

    CUDA_VISIBLE_DEVICES=0 timeout 300 python benchmarks/gpu/trainer_setups.py --out OUT --liger   # one GPU visible: else DataParallel

  budget   measure_token_budget(longest=--longest) without and with Liger's fused loss
           (applied by hand to the instance, fused loss only) at the 1B shape (32k vocabulary)
           and at an 8B-like shape with a 151,936 vocabulary (hidden 4096, 32/8 heads, MLP
           14336, --layers-8b layers, 4 by default instead of 32: the logits are the wall, not
           the layers), bf16 weights, AdamW states counted
  train    PackingTrainer on the 1B shape (--liger-tokens per micro-batch), unfused, then TrainingArguments(use_liger_kernel=True)
           (every Liger kernel, as users turn it on), same data and budget: per-step losses side
           by side (max |difference|) and tokens/s

CPU check: ``--smoke`` (gloo, tiny float32 model, sdpa; DDP and FSDP only: DeepSpeed and Liger
need CUDA), e.g. ``torchrun --nproc-per-node 2 benchmarks/gpu/trainer_setups.py --smoke --setup ddp --out /tmp/s``.
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

from packing_collators import PackingTrainer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the shared _shared module
from _shared import (  # noqa: E402
    FSDP2,
    SIZES,
    StepClock,
    add_trainer_options,
    build_model,
    gather_ranks,
    markov_examples,
    trained,
    training_arguments,
    write_run,
)

EXAMPLES = HERE.parents[1] / "examples"
SETUPS = ("ddp", "fsdp", "zero2", "zero3")
SHAPE_8B = (4096, 4, 32, 8, 14336)  # hidden, layers (--layers-8b), heads, kv heads, MLP
VOCAB_8B = 151936


def _training_args(args, cuda: bool, **extra):
    workers = 0 if args.smoke else 2
    return training_arguments(args, cuda, bf16=cuda, dataloader_num_workers=workers, **extra)


def _setup_options(setup: str) -> dict:
    if setup in ("zero2", "zero3"):  # the config as users write it: TrainingArguments fills every "auto"
        return dict(deepspeed=json.loads((EXAMPLES / f"ds_{setup}.json").read_text()))
    return FSDP2 if setup == "fsdp" else {}


def run_setup(args) -> None:
    """One set-up on every rank of a torchrun launch; rank 0 writes OUT/<setup>.json."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and args.setup.startswith("zero"):
        raise SystemExit("DeepSpeed set-ups need CUDA GPUs (run --setup ddp or fsdp for the CPU check).")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    lengths, dataset = markov_examples(args)
    training_args = _training_args(args, cuda, **_setup_options(args.setup))  # before the model: ZeRO-3 sees it
    model = build_model(args, args.attn, torch.device("cuda" if cuda else "cpu"), torch.float32)
    clock = StepClock(cuda)
    trainer = PackingTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        max_tokens_per_batch=args.tokens_per_batch,
        attn_implementation=None,
    )
    trainer.add_callback(clock.callback())
    local = trained(trainer, clock, lengths, args.warmup)
    numbers = [local["tokens"], local["seconds"], local["peak_gib"], local["steps"]]
    gathered = gather_ranks(numbers, world, trainer.args.device)
    if rank != 0:
        return
    result = {
        "setup": args.setup,
        "world_size": world,
        "card": torch.cuda.get_device_name() if cuda else "cpu",
        "wrapped_as": type(trainer.model_wrapped).__name__,
        "accelerate_distributed_type": str(trainer.accelerator.distributed_type),
        "loss": local["loss"],
        "real_tokens_per_s": sum(float(g[0]) for g in gathered) / max(float(g[1]) for g in gathered),
        "peak_gib_per_rank": [round(float(g[2]), 2) for g in gathered],
        "steps_per_rank": [int(g[3]) for g in gathered],
        "probe": local["probe"].summary() if local["probe"] else None,
        "size": args.size,
        "tokens_per_batch": args.tokens_per_batch,
        "command": " ".join(["torchrun --nproc-per-node", str(world), *sys.argv]),
    }
    write_run(args.out, args.setup, result)


def _fused_loss_only(model):
    """Liger's fused linear cross-entropy on this instance only (its rope/norm/MLP patches are module-wide)."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(rope=False, rms_norm=False, swiglu=False, fused_linear_cross_entropy=True, model=model)
    return model


def _budget(args, shape: str, liger: bool) -> dict:
    """measure_token_budget on a fresh model of ``shape`` ("1b" or "8b_like"), bf16 weights, unfused or fused."""
    from packing_collators import measure_token_budget

    dims = SIZES["1b"] if shape == "1b" else (SHAPE_8B[0], args.layers_8b, *SHAPE_8B[2:])
    vocab = args.vocab if shape == "1b" else VOCAB_8B
    shaped = argparse.Namespace(**{**vars(args), "vocab": vocab, "max_length": args.longest})
    model = build_model(shaped, "packing_varlen", torch.device("cuda"), torch.bfloat16, dims)
    if liger:
        _fused_loss_only(model)
    started = time.perf_counter()
    try:
        budget = measure_token_budget(model, longest=args.longest)
        row = {"max_tokens_per_batch": budget.max_tokens_per_batch, "summary": budget.summary()}
    except ValueError as refused:  # one example of --longest does not fit
        row = {"max_tokens_per_batch": 0, "summary": str(refused)}
    row.update(
        shape=shape,
        liger=liger,
        layers=dims[1],
        hidden=dims[0],
        vocab=vocab,
        parameters=sum(p.numel() for p in model.parameters()),
        seconds=round(time.perf_counter() - started, 1),
    )
    del model
    torch.cuda.empty_cache()
    print(json.dumps(row))
    return row


def _liger_training(args, dataset, lengths, liger: bool) -> dict:
    model = build_model(
        argparse.Namespace(**{**vars(args), "size": "1b"}), "packing_varlen", torch.device("cuda"), torch.float32
    )
    clock = StepClock(True)
    training_args = _training_args(args, True, use_liger_kernel=liger)
    trainer = PackingTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        max_tokens_per_batch=args.liger_tokens,
        attn_implementation=None,
    )
    trainer.add_callback(clock.callback())
    torch.cuda.reset_peak_memory_stats()
    result = trained(trainer, clock, lengths, args.warmup)
    del result["forward_seconds"]  # no forward clock here
    result["probe"] = result["probe"].summary() if result["probe"] else None
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
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
    difference = _relative_difference(fused["loss"], plain["loss"])
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


def _relative_difference(losses, reference) -> float:
    """max over steps of |loss - reference| / |reference|."""
    steps = min(len(losses), len(reference))
    losses, reference = np.array(losses[:steps]), np.array(reference[:steps])
    return float((np.abs(losses - reference) / np.abs(reference)).max())


def compare(out: Path, tolerance: float) -> None:
    """One table: each set-up's tokens/s and its per-step losses against DDP's."""
    runs = {s: json.loads((out / f"{s}.json").read_text()) for s in SETUPS if (out / f"{s}.json").exists()}
    if "ddp" not in runs:
        raise SystemExit(f"{out}/ddp.json is missing: run --setup ddp first")
    reference = runs["ddp"]["loss"]
    lines = [
        "| set-up | wrapped as | tokens/s | vs DDP | max rel. loss diff vs DDP | within bf16 noise | peak GiB/rank |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    summary = {}
    for name, run in runs.items():
        diff = _relative_difference(run["loss"], reference)
        ratio = run["real_tokens_per_s"] / runs["ddp"]["real_tokens_per_s"]
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
    card = runs["ddp"]["card"]
    text = f"{card} x{runs['ddp']['world_size']}, {runs['ddp']['size']}, {runs['ddp']['tokens_per_batch']} tokens/micro-batch\n\n"
    text += "\n".join(lines) + "\n"
    (out / "setups.md").write_text(text)
    (out / "setups.json").write_text(json.dumps({"card": card, "tolerance": tolerance, "runs": summary}, indent=1))
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--setup", choices=SETUPS, help="one 2-GPU set-up (under torchrun)")
    mode.add_argument("--liger", action="store_true", help="the 1-GPU Liger measurements")
    mode.add_argument("--compare", action="store_true", help="the table of the --setup runs in --out")
    add_trainer_options(parser, examples=6000, steps=15, warmup=3)
    parser.add_argument("--longest", type=int, default=4096, help="--liger: the longest example of the budget")
    parser.add_argument("--liger-tokens", type=int, default=8192, help="--liger: tokens per micro-batch of the 1B runs")
    parser.add_argument("--layers-8b", type=int, default=4, help="--liger: layers of the 8B-like shape (32 in 8B)")
    parser.add_argument(
        "--tolerance", type=float, default=0.02, help="max relative |loss difference| per step counted as bf16 noise"
    )
    args = parser.parse_args()
    if args.smoke:
        args.size, args.vocab, args.attn, args.examples, args.steps, args.warmup = "tiny", 128, "sdpa", 600, 3, 1
        args.tokens_per_batch, args.max_length = 512, 128
    if args.compare:
        compare(args.out, args.tolerance)
    elif args.liger:
        run_liger(args)
    else:
        run_setup(args)


if __name__ == "__main__":
    main()
