"""scale_8b.py --runner trainer: the same rows through PackingTrainer (accelerate's FSDP2, its activation
checkpointing, the chunked loss, its layers compiled by ``compile_layers``: ``--compile-layers``), one sampler rank
per process."""

from __future__ import annotations

import gc
import sys

import torch
from _scale_8b_data import documents
from _scale_8b_metrics import H100_BF16_PEAK, flops_per_token, flops_row, mfu
from _shared import gather_ranks


def run_trainer(args, rank: int, world: int, device: torch.device, build, shape, versions: dict) -> dict | None:
    """The same rows through PackingTrainer: accelerate's FSDP2 (its activation checkpointing), the chunked loss;
    ``build()``: scale_8b.py's model of ``shape`` on ``device``, not yet wrapped."""
    from _shared import StepClock, trained, training_arguments
    from datasets import Dataset

    from packing_collators import PackingTrainer

    cuda, dtype = device.type == "cuda", torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths, docs = documents(args.distribution, args.examples, args.max_length, shape.vocab, args.seed)
    model = build()
    fsdp = {}
    if world > 1:
        fsdp = {"fsdp": "full_shard auto_wrap", "fsdp_config": {
            "version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            "activation_checkpointing": args.ac == "full",
            "reshard_after_forward": args.reshard_after_forward == "always"}}  # fmt: skip
    training = training_arguments(args, cuda, gradient_checkpointing=world == 1 and args.ac == "full",
                                  max_grad_norm=1.0, **fsdp)  # fmt: skip
    clock = StepClock(cuda, model)
    trainer = PackingTrainer(model=model, args=training, train_dataset=Dataset.from_dict({"input_ids": docs}),
                             max_tokens_per_batch=args.tokens_per_batch, attn_implementation=None,
                             loss_implementation="chunked",
                             compile_layers={"true": True, "false": False}.get(args.compile_layers, "auto"))  # fmt: skip
    trainer.add_callback(clock.callback())
    run = trained(trainer, clock, lengths, args.warmup)
    gathered = gather_ranks([run["tokens"], run["seconds"], run["peak_gib"]], world, device)
    wrapped, kind = type(trainer.model_wrapped).__name__, str(trainer.accelerator.distributed_type)
    step_seconds = [None, *(round(b - a, 4) for a, b in zip(clock.ends, clock.ends[1:]))]  # step 1: no start mark
    from packing_collators.models._compile_layers import checkpointed_layers

    compiled = bool(trainer._compile.enabled)  # compile_layers="auto": the layers compiled on a GPU (FSDP2 too)
    in_graph = checkpointed_layers(trainer.model)  # FSDP2's activation checkpointing inside the layers' graphs
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)  # None policy: MixedPrecisionPolicy(), which
    policy = repr(plugin.mixed_precision_policy) if plugin else None  # reduces in the parameters' dtype
    del trainer, model, clock  # before the process group goes
    gc.collect()
    if rank != 0:
        return None
    rate = sum(float(g[0]) for g in gathered) / max(float(g[1]) for g in gathered) / world
    flops = flops_per_token(shape, flops_row(args))
    return {
        "name": args.name, "runner": "PackingTrainer", "gpus": world, "replicas": args.replicas,
        "card": torch.cuda.get_device_name(device) if cuda else "cpu", "versions": versions,
        "attention": args.attn, "activation_checkpointing": args.ac, "compile": compiled,
        "layers_checkpointed_in_graph": in_graph,
        "dtype": str(dtype).removeprefix("torch."),
        "tokens_per_batch": args.tokens_per_batch, "distribution": args.distribution, "steps": args.steps,
        "warmup": args.warmup, "tokens_per_s_per_gpu": rate, "flops_per_token": flops, "mfu": mfu(flops, rate),
        "peak_flops": H100_BF16_PEAK, "loss": run["loss"], "loss_implementation": "chunked",
        "step_seconds": step_seconds,
        "peak_allocated_gib_per_gpu": [round(float(g[2]), 2) for g in gathered],
        "reshard_after_forward": args.reshard_after_forward, "wrapped_as": wrapped, "accelerate_distributed_type": kind, "fsdp_mixed_precision_policy": policy,
        "command": f"torchrun --nproc-per-node {world} " + " ".join(sys.argv),
    }  # fmt: skip
