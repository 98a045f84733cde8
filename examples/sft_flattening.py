"""Fine-tune with transformers' Trainer and FlatteningCollator (online minibatch flattening).

The Trainer draws ``--batch-size`` examples per micro-batch as usual; the collator lays
them end to end in one row with ``position_ids`` restarting at every example, instead of
padding them to the longest. Optimizer steps, examples per step and the loss are exactly
those of a padded run; only the padding's compute is gone.

    collator = FlatteningCollator()
    Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator).train()

Defaults run offline (tiny random Llama, conversations from the Python docs); see
``examples/_common.py``. On a GPU pass ``--attn-implementation flash_attention_2`` or
``packing_varlen``.

Usage: python examples/sft_flattening.py [--model NAME] [--dataset NAME|FILES] [--max-steps N]
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

from packing_collators import FlatteningCollator, PackingCheckCallback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    args = parser.parse_args()

    tokenizer = load_tokenizer(args.model)
    dataset = sft_dataset(args, tokenizer)
    model = load_model(
        args.model, tokenizer, attn_implementation=args.attn_implementation, max_length=args.max_length, seed=args.seed
    )
    collator = BatchCounter(FlatteningCollator())
    trainer = Trainer(
        model=model,
        args=training_arguments(args),
        train_dataset=dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[PackingCheckCallback()],
    )  # refuses unsafe set-ups
    train_and_summarize("Trainer + FlatteningCollator", trainer, collator, args, dataset)


if __name__ == "__main__":
    main()
