"""What PackingTrainer's token budget is measured on (``budget.GpuRun``), read off the Trainer.

    trainer.model whole on one CUDA device   ->  GpuRun.model (else None: "auto" refused, no memory check)
    TrainingArguments bf16 / fp16            ->  GpuRun.autocast_dtype
    the loss its steps compute               ->  GpuRun.loss_implementation ("full" where the logits are needed)

Cost: attribute reads.
"""

from __future__ import annotations

from .._model_unwrap import probe_module
from ..budget import GpuRun
from ._autocast import autocast_dtype

__all__ = ["gpu_run", "memory_model"]


def memory_model(trainer):
    """The model whose memory the budget is measured on, or None where it cannot be.

    That is a model whole on one CUDA device: not on a CPU, not sharded (FSDP, DeepSpeed),
    not split over several devices (model parallel, ``device_map``).
    """
    model = probe_module(trainer.model) if trainer.model is not None else None
    devices = {p.device for p in model.parameters()} if model is not None else set()
    split = (
        getattr(trainer, "is_fsdp_enabled", False)
        or getattr(trainer, "is_deepspeed_enabled", False)
        or getattr(trainer, "is_model_parallel", False)
        or len(devices) != 1
    )
    return None if split or next(iter(devices)).type != "cuda" else model


def gpu_run(trainer) -> GpuRun:
    """The :class:`GpuRun` of a PackingTrainer: its model on one GPU, its autocast, the loss its steps compute."""
    from ._head_loss import why_full_logits

    loss = "full" if why_full_logits(trainer) else trainer._head_loss.implementation
    return GpuRun(memory_model(trainer), autocast_dtype(trainer.args), loss)
