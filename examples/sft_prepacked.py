"""Fine-tune on a pre-packed dataset: pack_dataset once, then Trainer + PrePackedCollator.

The tokenized examples are bin-packed (best-fit decreasing, over the whole dataset)
into rows of at most ``--pack-length`` tokens before training; the Trainer then draws
``--rows-per-batch`` rows per micro-batch and the collator flattens them into one row
with ``position_ids`` restarting at every example::

    packed = pack_dataset(tokenized, max_length=512)          # rows with seq_lengths
    Trainer(model=model, args=TrainingArguments(..., remove_unused_columns=False),
            train_dataset=packed, data_collator=PrePackedCollator()).train()

The most throughput per step, but fewer, fuller optimizer steps than a padded run of
the same examples (a step holds as many examples as fit its rows); adjust the learning
rate or steps accordingly. Defaults run offline (see ``examples/_common.py``).

Usage: python examples/sft_prepacked.py [--model NAME] [--dataset NAME|FILES] [--pack-length 512]
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
from transformers import Trainer

from packing_collators import PackingCheckCallback, PrePackedCollator, pack_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--pack-length", type=int, default=None, help="tokens per packed row (default --max-length)")
    parser.add_argument("--rows-per-batch", type=int, default=2, help="packed rows per micro-batch (per process)")
    args = parser.parse_args()

    tokenizer = load_tokenizer(args.model)
    dataset = sft_dataset(args, tokenizer)
    packed, stats = pack_dataset(
        dataset, max_length=args.pack_length or args.max_length, seed=args.seed, return_stats=True
    )
    print(stats.summary())
    model = load_model(
        args.model, tokenizer, attn_implementation=args.attn_implementation, max_length=args.max_length, seed=args.seed
    )
    collator = BatchCounter(PrePackedCollator())
    training_args = training_arguments(
        args, per_device_train_batch_size=args.rows_per_batch, remove_unused_columns=False
    )  # keep seq_lengths for the collator
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=packed,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[PackingCheckCallback()],
    )
    train_and_summarize(
        "pack_dataset + PrePackedCollator + Trainer",
        trainer,
        collator,
        args,
        dataset,
        extra={
            "packed rows": f"{len(packed):,} rows of at most {stats.capacity:,} tokens, "
            f"{args.rows_per_batch} per micro-batch, row fill {stats.efficiency:.1%}",
        },
    )


if __name__ == "__main__":
    main()
