"""Tokenize chat data for SFT with tokenize_chat, and time it against apply_chat_template.

Prints what ``tokenize_chat`` kept and trained, one conversation with its trained tokens
bracketed, and conversations per second (best of ``--repeats``, interleaved) for:

    apply_chat_template      input_ids only, no labels (the floor: one render, one tokenization)
    tokenize_chat prefixes   assistant spans from rendering prefixes (ChatML has no markers)
    tokenize_chat markers    the same template with {% generation %} markers around each answer

    tokenized = tokenize_chat(dataset, tokenizer, max_length=512, overflow="truncate")

``--turns 4`` joins every 4 conversations into one 4-turn chat (rendering prefixes renders
twice per turn). Defaults run offline (python-docs and its ChatML BPE: ``offline_data.py``).

Usage: python examples/chat_tokenize.py [--dataset NAME|FILES] [--model NAME] [--turns N] [--num-proc N]

No GPU is used, on any machine: start it with plain ``python`` (``--num-proc`` spreads it over CPU cores).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from offline_data import OFFLINE_DATASET, OFFLINE_MODEL, load_conversations, load_tokenizer

from packing_collators import tokenize_chat

CHATML_MARKED = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|im_end|>\n{% endgeneration %}{% else %}{{ message['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def joined(dataset, turns: int):
    """Every ``turns`` consecutive conversations as one multi-turn conversation, in memory (no map cache)."""
    from datasets import Dataset

    chats = dataset["messages"]
    return Dataset.from_dict(
        {"messages": [sum(chats[i : i + turns], []) for i in range(0, len(chats) - turns + 1, turns)]}
    )


def shown(tokenizer, row: dict) -> str:
    """The conversation's text with each trained run of tokens in [[ ]]."""
    text, inside = "", False
    for token, label in zip(row["input_ids"], row["labels"]):
        if (label != -100) != inside:
            text, inside = text + ("[[" if not inside else "]]"), not inside
        text += tokenizer.decode([token])
    return text + ("]]" if inside else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=OFFLINE_DATASET, nargs="+", help="as the sft_* scripts take it")
    parser.add_argument("--model", default=OFFLINE_MODEL, help="the tokenizer's hub name or path (default: offline)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=512, help="examples are truncated to this many tokens")
    parser.add_argument("--turns", type=int, default=1, help="join N conversations into one N-turn chat")
    parser.add_argument("--num-proc", type=int, default=None, help="processes for datasets.map")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each; the best is printed")
    args = parser.parse_args()

    import datasets

    datasets.disable_progress_bars()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # tokenize_chat logs its counts
    tokenizer = load_tokenizer(args.model)
    dataset = joined(load_conversations(args.dataset, args.split, args.max_examples), args.turns)
    tokenized = tokenize_chat(
        dataset, tokenizer, max_length=args.max_length, overflow="truncate", num_proc=args.num_proc
    )
    print(shown(tokenizer, tokenized[0])[:600])
    logging.getLogger("packing_collators").setLevel(logging.WARNING)  # the timed runs below repeat it

    marked = load_tokenizer(args.model)
    marked.chat_template = CHATML_MARKED
    runs = {
        "apply_chat_template (input_ids only)": lambda: dataset.map(
            lambda batch: {"input_ids": tokenizer.apply_chat_template(batch["messages"], return_dict=False)},
            batched=True,
            num_proc=args.num_proc,
            remove_columns=["messages"],
        ),
        "tokenize_chat, rendering prefixes": lambda: tokenize_chat(dataset, tokenizer, num_proc=args.num_proc),
        "tokenize_chat, {% generation %} markers": lambda: tokenize_chat(dataset, marked, num_proc=args.num_proc),
    }
    best = dict.fromkeys(runs, float("inf"))
    results = {}
    for _ in range(args.repeats):  # interleaved, so a busy machine slows each alike
        for name, run in runs.items():
            start = time.perf_counter()
            results[name] = run()
            best[name] = min(best[name], time.perf_counter() - start)
    same = (
        results["tokenize_chat, rendering prefixes"]["labels"]
        == results["tokenize_chat, {% generation %} markers"]["labels"]
    )
    print(
        f"\n{len(dataset):,} conversations of {args.turns} turn(s); prefixes and markers give the same labels: {same}"
    )
    for name, seconds in best.items():
        print(f"  {name:<42} {len(dataset) / seconds:>8,.0f} conversations/s  ({seconds:.2f} s)")


if __name__ == "__main__":
    main()
