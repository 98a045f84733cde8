"""Fine-tune with a custom loop: DataLoader + MultipackBatchSampler + FlatteningCollator + accelerate.

The sampler packs example indices into micro-batches of at most ``--max-tokens-per-batch``
tokens and deals them to the processes, every process the same number per epoch; the
collator flattens each into one row. The sampler already shards, so the DataLoader is
not passed to ``accelerator.prepare`` (that would shard it a second time)::

    sampler = MultipackBatchSampler(lengths, budget, num_replicas=accelerator.num_processes,
                                    rank=accelerator.process_index)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=FlatteningCollator())

Micro-batches hold different numbers of tokens, so the loss is the sum over the step's
completion tokens on all processes divided by their global count (what padding with
``num_items_in_batch`` gives), not a mean of per-process means.

Launch one process per GPU, or one process (``--cpu`` with gloo on a machine without GPUs). One
process trains on one device (accelerate's, ``cuda:0``) however many GPUs it sees::

    python examples/sft_multipack.py                            # a CPU, or one GPU
    CUDA_VISIBLE_DEVICES=0 python examples/sft_multipack.py     # one GPU of several, the others left free
    torchrun --nproc-per-node 4 examples/sft_multipack.py       # 4 GPUs
    accelerate launch --num-processes 4 examples/sft_multipack.py
    accelerate launch --num-processes 2 --cpu examples/sft_multipack.py   # 2 CPU processes (gloo)
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from accelerate import Accelerator
from offline_data import load_conversations, load_model, load_tokenizer
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from packing_collators import FlatteningCollator, MultipackBatchSampler, lengths_from_dataset, tokenize_chat


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
    parser.add_argument("--logging-steps", type=int, default=10, help="show the loss every N steps")
    parser.add_argument(
        "--max-tokens-per-batch", type=int, default=None, help="token budget of a micro-batch (default: --batch-size x "
        "the mean example length, at least the longest example)",
    )  # fmt: skip
    return parser.parse_args()


class Counted:
    """The collator, recording each micro-batch: its examples' lengths, trained labels and token slots."""

    def __init__(self, collate):
        self.collate, self.batches = collate, []

    def __call__(self, features):
        batch = self.collate(features)
        lengths = [len(f["input_ids"]) for f in features]
        self.batches.append((lengths, int((batch["labels"] != -100).sum()), batch["input_ids"].numel()))
        return batch


def summarize(title, counted: Counted, accelerator, dataset, steps: int, seconds: float, losses, args, extra) -> None:
    """What every process trained, and what padding the same examples in random batches would cost."""
    seen = counted.batches[:steps]  # the DataLoader may have fetched one more
    lengths = np.array([n for batch in seen for n in batch[0]], dtype=np.int64)
    order = np.random.default_rng(args.seed).permutation(lengths)
    padded = sum(len(b) * int(b.max()) for b in np.array_split(order, range(args.batch_size, len(order), args.batch_size)))
    counts = torch.tensor([len(lengths), lengths.sum(), sum(b[1] for b in seen), sum(b[2] for b in seen), len(seen), padded])
    examples, tokens, trained, slots, micro_batches, padded = accelerator.reduce(counts.to(accelerator.device), "sum").tolist()
    if not accelerator.is_main_process:
        return
    print(f"\n== {title} ==")
    for key, value in {
        "dataset": f"{len(dataset):,} examples, {sum(len(ids) for ids in dataset['input_ids']):,} tokens",
        "examples": f"{examples:,}",
        "tokens": f"{tokens:,}",
        "trained tokens": f"{trained:,} (assistant tokens only; prompts masked)",
        "micro-batches": f"{micro_batches:,}",
        "optimizer steps": f"{steps:,}",
        "padded equivalent": f"{padded:,} token slots ({1 - tokens / padded:.1%} padding)",
        "padding waste avoided": f"{padded - slots:,} token slots ({(padded - slots) / padded:.1%})",
        "packing efficiency": f"{tokens / slots:.2%} ({tokens:,} tokens in {slots:,} slots)",
        "tokens/s": f"{tokens / seconds:,.0f} ({seconds:.1f} s)",
        "final loss": f"{losses[-1]:.4f}",
        **extra,
    }.items():
        print(f"{key + ':':<23}{value}")


def main() -> None:
    args = arguments()
    gpu = torch.cuda.is_available()  # bf16 autocast on a GPU, as the Trainer examples get from bf16=True
    accelerator = Accelerator(cpu=not gpu, mixed_precision="bf16" if gpu else "no")
    tokenizer = load_tokenizer(args.model)
    with accelerator.main_process_first():  # the first process builds the caches, the others read them
        conversations = load_conversations(args.dataset, args.split, args.max_examples)
        chat = ["messages"] if "messages" in conversations.column_names else ["prompt", "completion"]
        # input_ids and labels: only the assistant's tokens are trained (-100 elsewhere)
        dataset = tokenize_chat(conversations.select_columns(chat), tokenizer, max_length=args.max_length, overflow="truncate")
    lengths = lengths_from_dataset(dataset)
    budget = args.max_tokens_per_batch or max(int(args.batch_size * lengths.mean()), int(lengths.max()))
    sampler = MultipackBatchSampler(
        lengths, budget, num_replicas=accelerator.num_processes, rank=accelerator.process_index, seed=args.seed
    )
    counted = Counted(FlatteningCollator())
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=counted)

    model = load_model(args.model, tokenizer, attn_implementation=args.attn_implementation,
                       max_length=args.max_length, seed=args.seed)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    total_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.epochs * len(sampler))
    scheduler = get_cosine_schedule_with_warmup(optimizer, math.ceil(0.05 * total_steps), total_steps)
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader: the sampler already shards

    model.train()
    step, losses, start = 0, [], time.perf_counter()
    bar = tqdm(total=total_steps, desc="training", disable=not accelerator.is_main_process)
    for epoch in range(math.ceil(total_steps / len(sampler))):
        sampler.set_epoch(epoch)
        for batch in loader:
            batch = {k: v.to(accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            # Token-weighted loss over all processes: sum of token losses / global completion tokens.
            items = accelerator.reduce((batch["labels"] != -100).sum(), reduction="sum")
            loss = model(**batch, num_items_in_batch=items).loss
            accelerator.backward(loss * accelerator.num_processes)  # DDP averages gradients over processes
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(accelerator.reduce(loss.detach(), reduction="sum").item())
            step += 1
            bar.update()
            if step % args.logging_steps == 0:
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if step == total_steps:
                break
        if step == total_steps:
            break
    bar.close()
    plan = sampler.stats()
    extra = {
        "sampler plan": f"{plan['batches_per_epoch']:,} micro-batches per process per epoch of at most "
        f"{budget:,} tokens, budget filled {plan['efficiency']:.1%}",
        "planned tokens": f"{plan['tokens']:,} per epoch, all processes "
        f"({plan['repeated_examples']:,} repeated examples even out the last round)",
    }
    title = f"DataLoader + MultipackBatchSampler + accelerate ({accelerator.num_processes} process(es))"
    summarize(title, counted, accelerator, dataset, step, time.perf_counter() - start, losses, args, extra)
    # The DDP model holds the process group: free it on every rank before the group is torn down (a gloo
    # group destroyed under a live DDP model left one rank hanging at exit in about 1 run of 16 on 2 cores)
    del model, optimizer, scheduler
    accelerator.free_memory()
    accelerator.wait_for_everyone()  # no rank tears the process group down while another still uses it
    accelerator.end_training()


if __name__ == "__main__":
    main()
