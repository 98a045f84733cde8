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

Launch on one process, or several (``--cpu`` with gloo on a machine without GPUs):

    python examples/sft_multipack.py
    accelerate launch --num_processes 2 --cpu examples/sft_multipack.py
    torchrun --nproc_per_node 2 examples/sft_multipack.py
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from _common import BatchCounter, add_common_args, load_model, load_tokenizer, print_summary, sft_dataset
from accelerate import Accelerator
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from packing_collators import FlatteningCollator, MultipackBatchSampler, lengths_from_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument(
        "--max-tokens-per-batch",
        type=int,
        default=None,
        help="token budget of a micro-batch (default: --batch-size x the mean example length, "
        "at least the longest example)",
    )
    args = parser.parse_args()

    gpu = torch.cuda.is_available()  # bf16 autocast on GPU, as the Trainer examples get from bf16=True
    accelerator = Accelerator(cpu=not gpu, mixed_precision="bf16" if gpu else "no")
    tokenizer = load_tokenizer(args.model)
    with accelerator.main_process_first():  # the first process builds the caches, the others read them
        dataset = sft_dataset(args, tokenizer)
    lengths = lengths_from_dataset(dataset)
    budget = args.max_tokens_per_batch or max(int(args.batch_size * lengths.mean()), int(lengths.max()))
    sampler = MultipackBatchSampler(
        lengths, budget, num_replicas=accelerator.num_processes, rank=accelerator.process_index, seed=args.seed
    )
    counter = BatchCounter(FlatteningCollator())
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=counter)

    model = load_model(
        args.model, tokenizer, attn_implementation=args.attn_implementation, max_length=args.max_length, seed=args.seed
    )
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
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if step == total_steps:
                break
        if step == total_steps:
            break
    bar.close()
    seconds = time.perf_counter() - start

    totals = counter.totals(args.batch_size, step, args.seed)
    plan = sampler.stats()
    if accelerator.is_main_process:
        print_summary(
            f"DataLoader + MultipackBatchSampler + accelerate ({accelerator.num_processes} process(es))",
            totals,
            dataset_examples=len(dataset),
            dataset_tokens=int(lengths.sum()),
            steps=step,
            seconds=seconds,
            final_loss=losses[-1],
            extra={
                "sampler plan": f"{plan['batches_per_epoch']:,} micro-batches per process per epoch of at most "
                f"{budget:,} tokens, budget filled {plan['efficiency']:.1%}",
                "planned tokens": f"{plan['tokens']:,} per epoch, all processes "
                f"({plan['repeated_examples']:,} repeated examples even out the last round)",
            },
        )
    accelerator.wait_for_everyone()  # no rank tears the process group down while another still uses it
    accelerator.end_training()


if __name__ == "__main__":
    main()
