"""PackingTrainer's sequence-parallel hooks: the mesh, the checks, the loss normaliser and the probe.

``PackingTrainer(sequence_parallel_size=n)`` on a world of ``w`` processes::

    checks (every rank, before any collective)  n divides w, n divides the query heads, the attention
                                                 can be exact, the loss takes shift_labels
    mesh                                        ("dp", "sp") = (w / n, n): ranks r, r+1.. share a micro-batch
    sampler                                     w / n replicas, budget n x max_tokens_per_batch
    collator                                    SequenceShardCollator(your collator): this rank's T / n tokens
    num_items_in_batch                          shift_labels targets of every rank and micro-batch of the step
    loss on a rank                              its targets' summed loss / num_items_in_batch, times w (the
                                                Trainer's scaling, undone by DDP's mean over the w ranks)

so the loss and the gradients are those of the whole global batch run on one GPU.
Cost: one DeviceMesh at start, one all-reduce of a count per optimizer step (as without it).
"""

from __future__ import annotations

import logging

from .._model_unwrap import probe_module, text_config
from ..checks import check_collated_features, check_packing_support, refuse_failed_probe
from ._autocast import training_autocast

__all__ = ["SequenceParallelCheckCallback", "global_target_count", "group_budget_error", "setup_sequence_parallel"]

logger = logging.getLogger(__name__)


def _refuse_trainer_options(trainer, size: int) -> None:
    args = trainer.args
    if not args.average_tokens_across_devices:
        raise ValueError(
            f"sequence_parallel_size={size} normalises the loss by the target tokens of every rank; "
            "TrainingArguments(average_tokens_across_devices=False) would divide each shard by its own count. "
            "Leave average_tokens_across_devices=True."
        )
    if args.label_smoothing_factor:
        raise ValueError(
            f"sequence_parallel_size={size} computes the loss from shift_labels in the model; the Trainer's label "
            f"smoother (label_smoothing_factor={args.label_smoothing_factor}) shifts labels per shard. Set it to 0."
        )
    if not trainer.model_accepts_loss_kwargs:
        raise ValueError(
            f"sequence_parallel_size={size} needs a model whose forward passes shift_labels and num_items_in_batch "
            f"to its loss (transformers' causal LMs do); {type(trainer.model).__name__} does not."
        )
    if trainer.eval_packing != "multipack" and trainer.eval_dataset is not None:
        raise ValueError(
            f"sequence_parallel_size={size}: evaluation must give every rank of a group the same batch; pass "
            "eval_packing='multipack' (the eval loss stays token-weighted)."
        )


def setup_sequence_parallel(trainer, size: int):
    """Check the set-up (raising the same error on every rank), build the mesh, enable Ulysses.

    Returns the :class:`SequenceParallelMesh`.
    """
    from ..parallel import (
        check_sequence_parallel_model,
        check_sequence_parallel_size,
        enable_ulysses_attention,
        sequence_parallel_mesh,
    )
    model = probe_module(trainer.model)
    check_sequence_parallel_model(text_config(model), size)  # the model's own limits first, then the launch
    check_sequence_parallel_size(size, trainer.args.world_size)
    _refuse_trainer_options(trainer, size)
    mesh = sequence_parallel_mesh(size)
    name = enable_ulysses_attention(model, mesh.sp_group, size)
    logger.info(
        "PackingTrainer: sequence_parallel_size=%d (%d groups), attention %s, this rank: group %d shard %d",
        size, mesh.dp_size, name, mesh.dp_rank, mesh.sp_rank,
    )
    return mesh


def group_budget_error(error: ValueError, size: int, budget) -> ValueError:
    """The sampler's refusal of an over-long example, with the group's budget spelled out."""
    return ValueError(
        f"{error} (sequence_parallel_size={size}: a group's budget is {size} x max_tokens_per_batch={budget}; "
        "raise max_tokens_per_batch or sequence_parallel_size.)"
    )


def global_target_count(batch_samples, accelerator, device):
    """The targets (a shard's ``shift_labels`` that are not -100) of this step's micro-batches summed over every rank."""
    import torch

    from ..batch import target_count

    count = sum(target_count(batch) for batch in batch_samples)
    count = torch.as_tensor(count, device=device)
    return accelerator.gather(count.reshape(1)).sum() if accelerator.num_processes > 1 else count


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class SequenceParallelCheckCallback(_callback_base()):
    """When training begins: the static packing checks on the whole first batch, then the live probe
    through the sequence-parallel path (:func:`probe_sequence_parallel`), refused on every rank if it fails.
    """

    def __init__(self, mesh, *, probe: bool = True) -> None:
        self.mesh, self.probe, self.last_report = mesh, probe, None

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        from ..parallel import inner_attention, probe_sequence_parallel

        if model is None or train_dataloader is None:
            return
        module, dataset = probe_module(model), train_dataloader.dataset
        collator = getattr(train_dataloader.collate_fn, "collator", train_dataloader.collate_fn)  # before the cut
        features = [dataset[i] for i in range(min(4, len(dataset)))]
        batch = collator(features)
        check_collated_features(features, batch)
        with inner_attention(module):
            check_packing_support(module, batch, probe=False)
        if self.probe:
            self.last_report = probe_sequence_parallel(module, self.mesh, collator, autocast=training_autocast(args, module))
            logger.info("%s", self.last_report.summary())
            refuse_failed_probe(self.last_report, "cu_seq_lens")
