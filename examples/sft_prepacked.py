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
rate or steps accordingly. Defaults run offline (``offline_data.py``).

Usage: python examples/sft_prepacked.py [--model NAME] [--dataset NAME|FILES] [--pack-length 512]

Launch on one GPU (or a CPU), or one process per GPU (``--rows-per-batch`` per process). A plain
``python`` on a machine with several visible GPUs is refused before the first step: the Trainer
would train under DataParallel, which cannot split a packed row::

    python examples/sft_prepacked.py                            # a CPU, or a machine with one GPU
    CUDA_VISIBLE_DEVICES=0 python examples/sft_prepacked.py     # one GPU of several
    torchrun --nproc-per-node 4 examples/sft_prepacked.py       # 4 GPUs (or: accelerate launch --num-processes 4 ...)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from offline_data import load_conversations, load_model, load_tokenizer
from transformers import Trainer, TrainerCallback, TrainingArguments

from packing_collators import PackingCheckCallback, PrePackedCollator, pack_dataset, tokenize_chat


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama", help="hub name or path of a causal LM (default: offline)")
    parser.add_argument("--dataset", nargs="+", default=["python-docs"], help="hub name, or .json/.jsonl/.parquet "
                        "files with 'messages' (or 'prompt'/'completion'); default: offline python-docs")  # fmt: skip
    parser.add_argument("--split", default="train", help="dataset split (hub datasets)")
    parser.add_argument("--max-examples", type=int, default=None, help="use only the first N examples")
    parser.add_argument("--max-length", type=int, default=512, help="truncate examples to this many tokens")
    parser.add_argument("--batch-size", type=int, default=8, help="examples per micro-batch (per process)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--attn-implementation", default="sdpa", help="sdpa, flash_attention_2/4, packing_varlen, ...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument("--save-dir", default=None, help="save the fine-tuned model and tokenizer here")
    parser.add_argument("--pack-length", type=int, default=None, help="tokens per packed row (default --max-length)")
    parser.add_argument("--rows-per-batch", type=int, default=2, help="packed rows per micro-batch (per process)")
    return parser.parse_args()


class Counted(TrainerCallback):
    """The collator, recording each micro-batch it collates during training: lengths, trained labels, slots."""

    def __init__(self, collate):
        self.collate, self.batches = collate, []

    def __call__(self, features):
        batch = self.collate(features)
        lengths = [n for f in features for n in f.get("seq_lengths") or [len(f["input_ids"])]]  # a packed row: several
        self.batches.append((lengths, int((batch["labels"] != -100).sum()), batch["input_ids"].numel()))
        return batch

    def on_train_begin(self, *args, **kwargs):
        self.batches.clear()  # the packing checks collate a probe batch first


def summarize(title: str, counted: Counted, trainer, dataset, seconds: float, batch_size: int, seed: int, extra: str) -> None:
    """What was trained (all processes), and what padding the same examples in random batches would cost."""
    seen = counted.batches[: trainer.state.global_step * trainer.args.gradient_accumulation_steps]
    lengths = np.array([n for batch in seen for n in batch[0]], dtype=np.int64)
    order = np.random.default_rng(seed).permutation(lengths)
    padded = sum(len(b) * int(b.max()) for b in np.array_split(order, range(batch_size, len(order), batch_size)))
    counts = torch.tensor([len(lengths), lengths.sum(), sum(b[1] for b in seen), sum(b[2] for b in seen), len(seen), padded])
    if torch.distributed.is_initialized():  # every process's micro-batches
        counts = counts.to(trainer.args.device)
        torch.distributed.all_reduce(counts)
    examples, tokens, trained, slots, micro_batches, padded = counts.tolist()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if not trainer.is_world_process_zero():
        return
    print(f"\n== {title} ==")
    for key, value in {
        "dataset": f"{len(dataset):,} examples, {sum(len(ids) for ids in dataset['input_ids']):,} tokens",
        "examples": f"{examples:,}",
        "tokens": f"{tokens:,}",
        "trained tokens": f"{trained:,} (assistant tokens only; prompts masked)",
        "micro-batches": f"{micro_batches:,}",
        "optimizer steps": f"{trainer.state.global_step:,}",
        "padded equivalent": f"{padded:,} token slots ({1 - tokens / padded:.1%} padding)",
        "padding waste avoided": f"{padded - slots:,} token slots ({(padded - slots) / padded:.1%})",
        "packing efficiency": f"{tokens / slots:.2%} ({tokens:,} tokens in {slots:,} slots)",
        "tokens/s": f"{tokens / seconds:,.0f} ({seconds:.1f} s)",
        "final loss": f"{losses[-1]:.4f}" if losses else "none logged",
        "packed rows": extra,
    }.items():
        print(f"{key + ':':<23}{value}")


def main() -> None:
    args = arguments()
    tokenizer = load_tokenizer(args.model)
    conversations = load_conversations(args.dataset, args.split, args.max_examples)
    chat = ["messages"] if "messages" in conversations.column_names else ["prompt", "completion"]
    # input_ids and labels: only the assistant's tokens are trained (-100 elsewhere)
    dataset = tokenize_chat(conversations.select_columns(chat), tokenizer, max_length=args.max_length, overflow="truncate")
    packed, stats = pack_dataset(dataset, max_length=args.pack_length or args.max_length, seed=args.seed, return_stats=True)
    print(stats.summary())
    model = load_model(args.model, tokenizer, attn_implementation=args.attn_implementation,
                       max_length=args.max_length, seed=args.seed)  # fmt: skip
    gpu = torch.cuda.is_available()
    training_args = TrainingArguments(
        output_dir=str(Path(__file__).resolve().parent / ".cache" / "runs"), per_device_train_batch_size=args.rows_per_batch,
        num_train_epochs=args.epochs, max_steps=args.max_steps, learning_rate=args.lr, lr_scheduler_type="cosine",
        warmup_steps=0.05, logging_steps=args.logging_steps, save_strategy="no", report_to="none", seed=args.seed,
        use_cpu=not gpu, bf16=gpu, remove_unused_columns=False,  # keep seq_lengths for the collator
    )  # fmt: skip
    counted = Counted(PrePackedCollator())
    trainer = Trainer(
        model=model, args=training_args, train_dataset=packed, data_collator=counted, processing_class=tokenizer,
        callbacks=[PackingCheckCallback()],  # refuses, before the first step, a set-up that would mix examples
    )  # fmt: skip
    trainer.add_callback(counted)  # last: it starts counting after the checks' probe batch
    result = trainer.train()
    if args.save_dir:
        trainer.save_model(args.save_dir)
    rows = f"{len(packed):,} rows of at most {stats.capacity:,} tokens, {args.rows_per_batch} per micro-batch"
    summarize("pack_dataset + PrePackedCollator + Trainer", counted, trainer, dataset, result.metrics["train_runtime"],
              args.batch_size, args.seed, f"{rows}, row fill {stats.efficiency:.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
