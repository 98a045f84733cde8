"""Fine-tune with PackingTrainer: the multipack sampler wired into transformers' Trainer.

One line changes from a padded Trainer script: ``Trainer`` becomes ``PackingTrainer``.
Micro-batches are then token budgets (``--max-tokens-per-batch``; by default the batch
size times the mean example length; ``auto`` measures it on the GPU) filled by the multipack sampler and flattened by
``FlatteningCollator``; with several processes each gets its own, equally many batches::

    trainer = PackingTrainer(model=model, args=args, train_dataset=tokenized)

Steps sit between the two other modes: about as many examples per step as padding on
average, far less padding, no offline pass. Defaults run offline (see ``examples/_common.py``).

    python examples/sft_packing_trainer.py
    torchrun --nproc_per_node 2 examples/sft_packing_trainer.py
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

from packing_collators import FlatteningCollator, PackingTrainer


def budget(text: str) -> int | str:
    """``--max-tokens-per-batch``: a number of tokens, or ``auto``."""
    return text if text == "auto" else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument(
        "--max-tokens-per-batch",
        type=budget,
        default=None,
        help="token budget of a micro-batch (default: --batch-size x the mean example length), or 'auto': "
        "measured on the model and its GPU for the longest example (CUDA only)",
    )
    args = parser.parse_args()

    tokenizer = load_tokenizer(args.model)
    training_args = training_arguments(args)
    with training_args.main_process_first():  # the first process builds the caches, the others read them
        dataset = sft_dataset(args, tokenizer)
    model = load_model(
        args.model, tokenizer, attn_implementation=args.attn_implementation, max_length=args.max_length, seed=args.seed
    )
    collator = BatchCounter(FlatteningCollator())
    trainer = PackingTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        data_collator=collator,
        processing_class=tokenizer,
        max_tokens_per_batch=args.max_tokens_per_batch,
    )
    train_and_summarize("PackingTrainer", trainer, collator, args, dataset)


if __name__ == "__main__":
    main()
