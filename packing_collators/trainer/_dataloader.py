"""PackingTrainer's dataloaders: example lengths -> MultipackBatchSampler -> collator -> DataLoader.

    dataset --lengths--> trainer.make_batch_sampler --> index lists for this rank
            --collator--> (compile buckets) (sequence shard) --> accelerate.prepare(DataLoader)

accelerate's batch-sampler shard wrapper is made a pass-through: the sampler already gives
this rank its share (sharding again would train each rank on 1/world of its batches).
Cost: one pass over the lengths column per dataloader (the Arrow column for a ``datasets.Dataset``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .._compat import collator_with_removed_columns, remove_unused_columns
from ..checks import refuse_no_examples
from ..sampler import example_lengths

__all__ = ["multipack_dataloader"]

logger = logging.getLogger(__name__)


def report_dropped(sampler) -> None:
    """Log how many examples ``overflow='drop'`` left out (nothing is lost without a count)."""
    stats = sampler.stats() if callable(getattr(sampler, "stats", None)) else {}
    if stats.get("overflow_dropped_examples"):
        logger.warning(
            "PackingTrainer: overflow='drop' leaves out %d example(s) (%d tokens) longer than max_tokens_per_batch=%d.",
            stats["overflow_dropped_examples"],
            stats["overflow_dropped_tokens"],
            stats["max_tokens_per_batch"],
        )


def _is_arrow(dataset) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover
        return False
    return isinstance(dataset, datasets.Dataset)


def _sampler(trainer, lengths: np.ndarray, batch_size: int, shuffle: bool):
    """trainer.make_batch_sampler; an example over a sequence-parallel group's budget said as such."""
    try:
        return trainer.make_batch_sampler(lengths, batch_size, shuffle=shuffle)
    except ValueError as error:  # an example over the budget: under sequence parallelism, the group's
        if trainer._sequence_parallel is None:
            raise
        from ._sequence_parallel import group_budget_error

        raise group_budget_error(error, trainer.sequence_parallel_size, trainer.max_tokens_per_batch) from error


def _loader_options(args) -> dict[str, Any]:
    options: dict[str, Any] = {"num_workers": args.dataloader_num_workers, "pin_memory": args.dataloader_pin_memory}
    if args.dataloader_num_workers > 0:
        options["persistent_workers"] = args.dataloader_persistent_workers
        if args.dataloader_prefetch_factor is not None:
            options["prefetch_factor"] = args.dataloader_prefetch_factor
    return options


def multipack_dataloader(trainer, dataset, description: str, batch_size: int, *, shuffle: bool):
    """The (prepared DataLoader, batch sampler) of a train (``shuffle=True``) or eval dataset."""
    from torch.utils.data import DataLoader, IterableDataset

    from ._trainer_budget import check_memory

    if isinstance(dataset, IterableDataset):
        raise ValueError(
            f"PackingTrainer needs a map-style {description.lower()} dataset (it packs by example lengths); "
            "got an IterableDataset. Use Trainer with FlatteningCollator for streaming data."
        )
    collator, is_arrow = trainer.data_collator, _is_arrow(dataset)
    if is_arrow:
        dataset = remove_unused_columns(trainer, dataset, description)
    lengths = example_lengths(dataset, trainer.length_column)
    if shuffle:
        refuse_no_examples(len(lengths))
    sampler = _sampler(trainer, lengths, batch_size, shuffle)
    if shuffle and len(lengths):  # the longest example a training batch can hold: the attention warm-up's reach
        budget = trainer.token_budget(lengths, batch_size)
        trainer._train_longest = int(min(lengths.max(), budget))
        check_memory(trainer, budget, trainer._train_longest)
        if trainer.args.torch_compile:  # rows padded to a bucket: a padding segment may be as long as the bucket
            collator = trainer._compile.training_collator(collator, sampler, budget)
            trainer._train_longest = max([trainer._train_longest, *trainer._compile.buckets])
    if not is_arrow:
        collator = collator_with_removed_columns(trainer, collator, description)
    if trainer._sequence_parallel is not None:  # every rank of a group collates the micro-batch and keeps its shard
        from ..parallel import SequenceShardCollator

        mesh = trainer._sequence_parallel
        collator = SequenceShardCollator(collator, rank=mesh.sp_rank, size=mesh.size)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, **_loader_options(trainer.args))
    loader = trainer.accelerator.prepare(loader)
    # The sampler already gives this rank its share; accelerate's shard wrapper would shard
    # it again (each rank would train on 1/world of its batches). Make the wrapper a pass-through.
    wrapper = getattr(loader, "batch_sampler", None)
    if wrapper is not None and wrapper is not sampler and getattr(wrapper, "batch_sampler", None) is sampler:
        wrapper.num_processes, wrapper.process_index = 1, 0
    return loader, sampler
