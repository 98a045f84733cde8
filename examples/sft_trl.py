"""Fine-tune with TRL's SFTTrainer, packed: online (FlatteningCollator) and offline (pack_dataset rows).

SFTTrainer takes the tokenized dataset as it is and a collator that packs::

    args = SFTConfig(..., dataset_kwargs={"skip_prepare_dataset": True})  # already tokenized
    checks = [PackingCheckCallback()]                                     # refuses unsafe set-ups
    # online: each micro-batch of examples becomes one flat row (the padded run's steps and loss)
    SFTTrainer(model=model, args=args, train_dataset=tokenized, processing_class=tokenizer,
               data_collator=FlatteningCollator(), callbacks=checks).train()
    # offline: examples packed into rows once, each micro-batch of rows flattened
    SFTTrainer(model=model, args=args, train_dataset=pack_dataset(tokenized, max_length=512),
               processing_class=tokenizer, data_collator=PrePackedCollator(), callbacks=checks).train()

Leave SFTConfig's ``padding_free`` and ``packing`` off (the defaults): the collator packs. SFTTrainer
keeps the ``seq_lengths`` column that PrePackedCollator reads, so ``remove_unused_columns`` can stay
on. Its default collator would train each pack_dataset row as one sequence (its examples attending
to each other); PackingCheckCallback refuses that before the first step.

Defaults run offline (tiny random Llama, conversations from the Python docs; see
``examples/_common.py``). Needs ``pip install trl`` (in the ``dev`` and ``bench`` extras).

Usage: python examples/sft_trl.py [--recipe online|offline|both] [--model NAME] [--dataset NAME|FILES]
"""

from __future__ import annotations

import argparse

from _common import (
    BatchCounter,
    add_common_args,
    load_model,
    load_tokenizer,
    sft_dataset,
    train_and_summarize,
    training_arguments,
)
from trl import SFTConfig, SFTTrainer

from packing_collators import FlatteningCollator, PackingCheckCallback, PrePackedCollator, pack_dataset


def sft_config(args, **overrides) -> SFTConfig:
    """The common training arguments as an SFTConfig that takes the tokenized dataset as it is."""
    common = training_arguments(args, **overrides).to_dict()  # bf16 and gradient_checkpointing set explicitly
    return SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True})


def train(title: str, args, tokenizer, dataset, train_dataset, collate, config: SFTConfig, extra=None) -> None:
    model = load_model(
        args.model, tokenizer, attn_implementation=args.attn_implementation, max_length=args.max_length, seed=args.seed
    )
    counter = BatchCounter(collate)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=train_dataset,
        data_collator=counter,
        processing_class=tokenizer,
        callbacks=[PackingCheckCallback()],
    )
    train_and_summarize(title, trainer, counter, args, dataset, extra=extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--recipe", choices=("online", "offline", "both"), default="both", help="default both")
    parser.add_argument("--pack-length", type=int, default=None, help="offline: tokens per packed row (--max-length)")
    parser.add_argument("--rows-per-batch", type=int, default=2, help="offline: packed rows per micro-batch")
    args = parser.parse_args()

    tokenizer = load_tokenizer(args.model)
    dataset = sft_dataset(args, tokenizer)
    if args.recipe in ("online", "both"):
        config = sft_config(args)
        train("SFTTrainer + FlatteningCollator", args, tokenizer, dataset, dataset, FlatteningCollator(), config)
    if args.recipe in ("offline", "both"):
        packed, stats = pack_dataset(
            dataset, max_length=args.pack_length or args.max_length, seed=args.seed, return_stats=True
        )
        print(stats.summary())
        config = sft_config(args, per_device_train_batch_size=args.rows_per_batch)
        rows = f"{len(packed):,} rows of at most {stats.capacity:,} tokens, {args.rows_per_batch} per micro-batch"
        extra = {"packed rows": f"{rows}, row fill {stats.efficiency:.1%}"}
        title = "SFTTrainer + pack_dataset + PrePackedCollator"
        train(title, args, tokenizer, dataset, packed, PrePackedCollator(), config, extra=extra)


if __name__ == "__main__":
    main()
