"""PackingTrainer prepares its model: ``enable_packing``, and what sequence parallelism cannot shard.

    PackingTrainer(model=Qwen3.5 / Nemotron-H / Qwen2.5-VL, ...)
      enable_packing(model)        stateful layers per example or on varlen kernels; multimodal
                                   positions per example (logged: which path each layer kind takes)
      sequence_parallel_size > 1   refused for such a model: a layer's state (and an image) would have
                                   to cross the ranks that each hold a slice of the row

Cost: one walk over the model's modules, at construction.
"""

from __future__ import annotations

__all__ = ["prepare_trainer_model"]


def prepare_trainer_model(trainer, model) -> None:
    """``enable_packing(model)`` (the trainer's), and the refusal of sequence parallelism it cannot keep exact."""
    from ..models import enable_packing, packing_layers

    if model is None:
        return
    enable_packing(model)
    layers = packing_layers(model)
    if trainer.sequence_parallel_size > 1 and (layers.stateful or layers.multimodal):
        what = ", ".join(layers.stateful) or f"{layers.multimodal}'s images"
        raise ValueError(
            f"sequence_parallel_size={trainer.sequence_parallel_size} splits each packed row across ranks, and "
            f"this model has layers that carry state along the sequence or positions from images ({what}): a "
            "rank's slice would start without the state (or the image) of the slices before it. Train it with "
            "sequence_parallel_size=1 (data parallel: each rank packs whole examples)."
        )
