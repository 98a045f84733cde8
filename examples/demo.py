"""Padding vs packing, trained side by side: the same examples, the same optimizer steps.

Two copies of the same model (same random init) train on the same batches of the same
examples, in the same random order, one step each in turn:

- padded: each batch padded to its longest example (``DataCollatorForSeq2Seq``), with an
  ``attention_mask``;
- packed: each batch flattened into one row with ``FlatteningCollator``: no padding,
  ``position_ids`` restart at every example, so attention never crosses examples.

The losses agree step by step (printed for the first step and the last ones): packing
changes how much work a step does, not what it computes. Defaults run offline in a few
minutes on 2 CPU cores: the ``tiny-llama`` model and the ``python-docs`` dataset
(``offline_data.py``).

Usage: python examples/demo.py [--examples 800] [--batch-size 8] [--model ...] [--dataset ...]

One process, one device: it trains on ``cuda:0`` when there is a GPU, whatever the count (pick one with
``CUDA_VISIBLE_DEVICES=1 python examples/demo.py``); it has no several-GPU mode (start no torchrun).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from offline_data import load_conversations, load_model, load_tokenizer
from tqdm.auto import tqdm
from transformers import DataCollatorForSeq2Seq

from packing_collators import FlatteningCollator, tokenize_chat


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama", help="hub name or path of a causal LM (default: offline)")
    parser.add_argument("--dataset", nargs="+", default=["python-docs"], help="hub name, or .json/.jsonl/.parquet "
                        "files with 'messages' (or 'prompt'/'completion'); default: offline python-docs")  # fmt: skip
    parser.add_argument("--split", default="train", help="dataset split (hub datasets)")
    parser.add_argument("--max-examples", type=int, default=None, help="tokenize only the first N examples")
    parser.add_argument("--examples", type=int, default=800, help="examples to train on (a seeded random subset)")
    parser.add_argument("--max-length", type=int, default=512, help="truncate examples to this many tokens")
    parser.add_argument("--batch-size", type=int, default=8, help="examples per step")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--attn-implementation", default="sdpa", help="sdpa, flash_attention_2/4, packing_varlen, ...")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    tokenizer = load_tokenizer(args.model)
    conversations = load_conversations(args.dataset, args.split, args.max_examples)
    chat = ["messages"] if "messages" in conversations.column_names else ["prompt", "completion"]
    # input_ids and labels: only the assistant's tokens are trained (-100 elsewhere)
    dataset = tokenize_chat(conversations.select_columns(chat), tokenizer, max_length=args.max_length, overflow="truncate")
    order = np.random.default_rng(args.seed).permutation(len(dataset))[: args.examples]
    batches = [[dataset[int(i)] for i in order[s : s + args.batch_size]] for s in range(0, len(order), args.batch_size)]
    if args.max_steps > 0:
        batches = batches[: args.max_steps]

    runs = {
        "padded": DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100, return_tensors="pt"),
        "packed": FlatteningCollator(),
    }
    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = {
        name: load_model(
            args.model,
            tokenizer,
            attn_implementation=args.attn_implementation,
            max_length=args.max_length,
            seed=args.seed,
        ).to(device)
        for name in runs
    }
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=args.lr) for name, model in models.items()}
    seconds = dict.fromkeys(runs, 0.0)
    slots = dict.fromkeys(runs, 0)
    losses = {name: [] for name in runs}
    tokens = sum(len(e["input_ids"]) for batch in batches for e in batch)

    print(
        f"{len(order):,} examples, {tokens:,} tokens, {len(batches)} steps of {args.batch_size} examples; "
        f"model {args.model} ({sum(p.numel() for p in models['padded'].parameters()) / 1e6:.1f}M parameters), "
        f"attention {args.attn_implementation}, {device} ({torch.get_num_threads()} threads)"
    )
    bar = tqdm(batches, desc="padded and packed, step by step", unit="step")
    for step, examples in enumerate(bar):
        for name, collate in runs.items():  # alternate, so machine noise hits both alike
            start = time.perf_counter()
            batch = collate([{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples])
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            loss = models[name](**batch).loss
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            losses[name].append(loss.item())  # .item() waits for the GPU, so the time is the step's
            seconds[name] += time.perf_counter() - start
            slots[name] += batch["input_ids"].numel()
        bar.set_postfix(padded=f"{losses['padded'][-1]:.3f}", packed=f"{losses['packed'][-1]:.3f}")

    last = min(10, len(batches))
    rows = {
        "optimizer steps": {n: f"{len(losses[n]):,}" for n in runs},
        "examples": {n: f"{len(order):,}" for n in runs},
        "tokens": {n: f"{tokens:,}" for n in runs},
        "token slots computed": {n: f"{slots[n]:,}" for n in runs},
        "padding fraction": {n: f"{1 - tokens / slots[n]:.1%}" for n in runs},
        "time": {n: f"{seconds[n]:.1f} s" for n in runs},
        "tokens/s": {n: f"{tokens / seconds[n]:,.0f}" for n in runs},
        "first-step loss": {n: f"{losses[n][0]:.6f}" for n in runs},
        f"mean loss, last {last} steps": {n: f"{np.mean(losses[n][-last:]):.4f}" for n in runs},
        "final loss": {n: f"{losses[n][-1]:.4f}" for n in runs},
    }
    print(f"\n{'':<28}{'padded':>14}{'packed':>14}")
    for key, values in rows.items():
        print(f"{key:<28}{values['padded']:>14}{values['packed']:>14}")
    print(
        f"\npacked is {seconds['padded'] / seconds['packed']:.2f}x faster than padded "
        f"({slots['padded'] - slots['packed']:,} padding token slots avoided); "
        f"first-step losses differ by {abs(losses['padded'][0] - losses['packed'][0]):.2e}"
    )


if __name__ == "__main__":
    main()
