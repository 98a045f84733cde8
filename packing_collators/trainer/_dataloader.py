"""PackingTrainer's dataloaders: example lengths -> the token budget -> MultipackBatchSampler -> collator -> DataLoader.

    dataset --lengths--> trainer.planned_budget --> PlannedBudget (once; checked on the GPU for training)
            --budget--> trainer.make_batch_sampler --> index lists for this rank
            --collator--> (compile buckets at the budget) (sequence shard) --> accelerate.prepare(DataLoader)

:func:`multipack_dataloader` returns what it made, a :class:`PackedLoader`: the prepared loader,
its sampler, the planned budget and, for training, the compile plan. It writes nothing on the
trainer; PackingTrainer hands those values to the callbacks that need them. accelerate's batch-sampler shard wrapper is made a
pass-through: the sampler already gives this rank its share (sharding again would train each rank
on 1/world of its batches).
Cost: one pass over the lengths column per dataloader (the Arrow column for a ``datasets.Dataset``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import collator_with_removed_columns, remove_unused_columns
from ..budget import PlannedBudget
from ..checks import refuse_no_examples
from ..sampler import example_lengths

__all__ = ["PackedLoader", "multipack_dataloader", "report_dropped"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackedLoader:
    """What :func:`multipack_dataloader` made.

    Attributes:
        loader: the DataLoader, prepared by accelerate.
        sampler: this rank's batch sampler (``trainer.make_batch_sampler``'s).
        budget: the micro-batch token budget and the longest example a micro-batch holds.
        compile_plan: training compiled (``trainer._compile.enabled``): the bucketed collator and its report.
        rows_are_examples: each dataset row is one sequence (not a pre-packed row of several).
    """

    loader: Any
    sampler: Any
    budget: PlannedBudget
    compile_plan: Any = None
    rows_are_examples: bool = True  # False: pre-packed rows (``seq_lengths``), several sequences each

    @property
    def warm_up_length(self) -> int | None:
        """The longest sequence a training micro-batch can hold: a compile bucket's padding segment counts."""
        longest = self.budget.longest or None
        if longest is None or self.compile_plan is None:
            return longest
        return max([longest, *self.compile_plan.report.buckets])

    @property
    def shortest_example(self) -> int:
        """The shortest example with tokens the sampler batches (1 where its lengths are unknown, or its rows are
        pre-packed: a row's sequences are shorter than it): no micro-batch's longest sequence is shorter."""
        lengths = np.asarray(getattr(self.sampler, "lengths", []))
        lengths = lengths[lengths > 0]
        return int(lengths.min()) if lengths.size and self.rows_are_examples else 1

    def batch_layouts(self) -> list[tuple[int, int]] | None:
        """(longest sequence, sequences) of each micro-batch of the sampler's current epoch, every rank's, from its
        plan: what FA4's warm-up must meet. Every rank's, so that every rank warms the same layouts (where the
        warm-up runs the model, a sharded model's passes are collectives). Under a compile plan each row is padded
        to its bucket with a padding segment of its own: a sequence of the layout too. None where that is not known
        from the lengths: the sampler has no plan (``trainer.make_batch_sampler`` returned another), the compile
        plan's collator does not say how it pads, or the rows are pre-packed."""
        plan, lengths = getattr(self.sampler, "plan", None), getattr(self.sampler, "lengths", None)
        options = getattr(self.sampler, "options", None)
        padded = self._padded_length()
        if not callable(plan) or lengths is None or padded is None or not self.rows_are_examples:
            return None
        lengths, epoch = np.asarray(lengths), plan()
        ranks = range(options.num_replicas) if options is not None else [self.sampler.rank]
        return [_layout(lengths[b], padded) for rank in ranks for b in epoch.batches(rank) if len(b)]

    def _padded_length(self):
        """tokens -> the row length the collator pads them to: the tokens themselves without a compile plan, the
        bucket under one (None where its collator does not say)."""
        if self.compile_plan is None:
            return lambda tokens: tokens
        return getattr(getattr(self.compile_plan.collator, "options", None), "padded_length", None)

    @property
    def most_sequences(self) -> int:
        """The most sequences a micro-batch can hold: the budget over the shortest example, and a compile bucket's
        padding segment."""
        return self.budget.tokens // self.shortest_example + (self.compile_plan is not None)


def _layout(lengths: np.ndarray, padded_length) -> tuple[int, int]:
    """(longest sequence, sequences) of a row of these examples, padded to ``padded_length(tokens)`` by a segment of
    its own.

    >>> _layout(np.array([300, 40]), lambda tokens: 512), _layout(np.array([300, 40]), lambda tokens: tokens)
    ((300, 3), (300, 2))
    >>> _layout(np.array([30, 40]), lambda tokens: 512)  # the padding segment is the longest sequence
    (442, 3)
    """
    tokens = int(lengths.sum())
    padding = int(padded_length(tokens)) - tokens
    longest = max(int(lengths.max()), padding)
    return longest, len(lengths) + (padding > 0)


def report_dropped(sampler) -> None:
    """Log how many examples ``overflow='drop'`` left out, and how many empty ones (no token) no batch holds:
    nothing is left out without a count."""
    stats = sampler.stats() if callable(getattr(sampler, "stats", None)) else {}
    if stats.get("empty_examples"):
        logger.warning("PackingTrainer: %d empty example(s) (no token) are in no batch.", stats["empty_examples"])
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


def refuse_untokenized(dataset, column: str, description: str) -> None:
    """Refuse a ``datasets.Dataset`` without the column of token ids, before the Trainer drops columns.

    >>> from datasets import Dataset
    >>> refuse_untokenized(Dataset.from_dict({"text": ["hi"]}), "input_ids", "Training")
    Traceback (most recent call last):
    ...
    ValueError: PackingTrainer packs tokenized examples, and the training dataset has no 'input_ids' column (its columns: ['text']). Tokenize it first (e.g. dataset.map(lambda example: tokenizer(example["text"]), remove_columns=dataset.column_names), or tokenize_chat(dataset, tokenizer) for conversations), or pass PackingTrainer(length_column=...) naming the column that holds the token ids.
    """
    columns = dataset.column_names
    if column in columns:
        return
    text = next((name for name in ("text", "content", "prompt") if name in columns), "text")
    raise ValueError(
        f"PackingTrainer packs tokenized examples, and the {description.lower()} dataset has no {column!r} column "
        f"(its columns: {columns}). Tokenize it first (e.g. dataset.map(lambda example: "
        f'tokenizer(example["{text}"]), remove_columns=dataset.column_names), or tokenize_chat(dataset, tokenizer) '
        "for conversations), or pass PackingTrainer(length_column=...) naming the column that holds the token ids."
    )


def _lengths(trainer, dataset, description: str, *, shuffle: bool):
    """(the dataset with the forward's columns, example lengths): a map-style dataset only."""
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset):
        raise ValueError(
            f"PackingTrainer needs a map-style {description.lower()} dataset (it packs by example lengths); "
            "got an IterableDataset. Use Trainer with FlatteningCollator for streaming data."
        )
    if _is_arrow(dataset):
        refuse_untokenized(dataset, trainer.length_column, description)  # before the Trainer drops its columns
        dataset = remove_unused_columns(trainer, dataset, description)
    lengths = example_lengths(dataset, trainer.length_column)
    if shuffle:
        refuse_no_examples(len(lengths))
    return dataset, lengths


def _sampler(trainer, lengths: np.ndarray, budget: int, shuffle: bool):
    """trainer.make_batch_sampler; an example over a sequence-parallel group's budget said as such."""
    try:
        return trainer.make_batch_sampler(lengths, budget, shuffle=shuffle)
    except ValueError as error:  # an example over the budget: under sequence parallelism, the group's
        if trainer.sequence_parallel_mesh is None:
            raise
        from ._sequence_parallel import group_budget_error

        raise group_budget_error(error, trainer.sequence_parallel_size, trainer.max_tokens_per_batch) from error


def _rank_collator(trainer, collator, dataset, description: str):
    """The collator as this rank runs it: the forward's columns kept (non-Arrow data), and under
    sequence parallelism every rank of a group collates the micro-batch and keeps its shard."""
    if not _is_arrow(dataset):
        collator = collator_with_removed_columns(trainer, collator, description)
    mesh = trainer.sequence_parallel_mesh
    if mesh is not None:
        from ..parallel import SequenceShardCollator

        collator = SequenceShardCollator(collator, rank=mesh.sp_rank, size=mesh.size)
    return collator


def _loader_options(args) -> dict[str, Any]:
    options: dict[str, Any] = {"num_workers": args.dataloader_num_workers, "pin_memory": args.dataloader_pin_memory}
    if args.dataloader_num_workers > 0:
        options["persistent_workers"] = args.dataloader_persistent_workers
        if args.dataloader_prefetch_factor is not None:
            options["prefetch_factor"] = args.dataloader_prefetch_factor
    return options


def prepared_loader(trainer, dataset, sampler, collator):
    """The DataLoader of ``sampler``'s micro-batches through the Trainer's ``accelerator.prepare``, the Trainer's
    dataloader options (workers, pinning), its batch-sampler shard wrapper a pass-through (``sampler`` already
    gives each rank its share): what a trainer on packed rows trains from, PackingTrainer's and PackingDPOTrainer's."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, **_loader_options(trainer.args))
    loader = trainer.accelerator.prepare(loader)
    wrapper = getattr(loader, "batch_sampler", None)
    if wrapper is not None and wrapper is not sampler and getattr(wrapper, "batch_sampler", None) is sampler:
        wrapper.num_processes, wrapper.process_index = 1, 0
    return loader


def multipack_dataloader(trainer, dataset, description: str, batch_size: int, *, shuffle: bool) -> PackedLoader:
    """The :class:`PackedLoader` of a train (``shuffle=True``) or eval dataset."""
    from ._compile import compile_plan

    dataset, lengths = _lengths(trainer, dataset, description, shuffle=shuffle)
    budget = trainer.planned_budget(lengths, batch_size, training=shuffle)  # once, as a value
    sampler = _sampler(trainer, lengths, budget.tokens, shuffle)
    collator, plan = trainer.data_collator, None
    if shuffle and len(lengths) and trainer._compile.enabled:  # rows padded to a bucket, graphs compiled first
        plan = compile_plan(collator, sampler, budget.tokens)
        collator = plan.collator if plan is not None else collator
    loader = prepared_loader(trainer, dataset, sampler, _rank_collator(trainer, collator, dataset, description))
    return PackedLoader(loader, sampler, budget, plan, rows_are_examples=not _prepacked(dataset))


def _prepacked(dataset) -> bool:
    """Rows of several sequences each (``pack_dataset``'s, with a ``seq_lengths`` column)."""
    if _is_arrow(dataset):
        return "seq_lengths" in dataset.column_names
    first = dataset[0] if len(dataset) else None
    return isinstance(first, dict) and first.get("seq_lengths") is not None
