"""Micro-batches of whole preference pairs that fill a token budget (``PackingDPOTrainer(max_tokens_per_batch=n)``).

    pair lengths = |P C| + |P R| (each cut to max_length as the collator cuts it)
      -> TrainerBudget.plan: n (a number, or "auto" measured for the longest pair; memory_check before training)
      -> MultipackBatchSampler(lengths, n, num_replicas=world, rank=rank)   whole pairs, equal steps per rank
      -> PreferenceCollator -> accelerate.prepare(DataLoader)                its shard wrapper a pass-through

A pair is never split: its chosen and rejected sequences share the micro-batch (the loss compares
them). Cost: one pass over the pairs' lengths per epoch plan.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pair_budget_loader", "pair_lengths"]


def pair_lengths(dataset, collator) -> np.ndarray:
    """int64 (pairs,): each pair's tokens in the packed row (chosen and rejected sequences, cut)."""
    limit = collator.max_length
    prompt = np.array([len(x) for x in dataset["prompt_ids"]], dtype=np.int64)
    total = np.zeros_like(prompt)
    for key in ("chosen_ids", "rejected_ids"):
        full = prompt + np.array([len(x) for x in dataset[key]], dtype=np.int64)
        total += full if limit is None else np.minimum(full, limit)
    return total


def pair_budget_loader(trainer, dataset, setting):
    """The train DataLoader of pairs packed into micro-batches of the budget ``setting`` (a ``budget.TrainerBudget``)
    plans for them: a number of tokens, or ``"auto"`` measured on the policy's GPU for the longest pair."""
    from .._compat import remove_unused_columns
    from .._validation import check_not_too_long
    from ..budget import GpuRun
    from ..sampler import MultipackBatchSampler
    from ..trainer import autocast_dtype, memory_model, prepared_loader

    args = trainer.args
    dataset = remove_unused_columns(trainer, dataset, "training")
    lengths = pair_lengths(dataset, trainer.data_collator)
    loss = "full" if trainer._head(trainer.model) is None else "chunked"
    gpu = GpuRun(memory_model(trainer), autocast_dtype(args), loss)
    budget = setting.plan(lengths, args.per_device_train_batch_size, gpu, training=True).tokens
    check_not_too_long(
        lengths, budget, limit_name="max_tokens_per_batch", item="Pair",
        fix="A pair is never split (its chosen and rejected sequences share a micro-batch): raise "
        "max_tokens_per_batch, or lower DPOConfig.max_length (each sequence is cut to it).",
    )  # fmt: skip
    sampler = MultipackBatchSampler(
        lengths, budget, num_replicas=args.world_size,
        rank=args.process_index, seed=args.data_seed if args.data_seed is not None else args.seed,
        drop_last=args.dataloader_drop_last,
    )  # fmt: skip
    loader = prepared_loader(trainer, dataset, sampler, trainer.data_collator)
    trainer._pair_sampler = sampler
    return loader
