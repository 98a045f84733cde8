"""Preference training (DPO) on packed rows: PackingDPOTrainer, TRL's DPOTrainer with no padding.

One line changes from a TRL DPO script: ``DPOTrainer`` becomes ``PackingDPOTrainer``. Each micro-batch's
pairs are laid end to end in one row (``[P1 C1 | P1 R1 | P2 C2 | ...]``), the policy and the reference
compute each sequence's log-probability from it, a chunk of tokens at a time, and the loss and metrics
are TRL's::

    trainer = PackingDPOTrainer(model=model, ref_model=None, args=DPOConfig(...), train_dataset=pairs,
                                processing_class=tokenizer)

``--share-prompt`` computes each pair's prompt once (chosen and rejected both attend to it, not to each
other); ``--max-tokens-per-batch`` fills a token budget with whole pairs. Defaults run offline: the
tiny model and python-docs conversations of ``offline_data.py``, each paired with another's answer as
the rejected one. Pass a hub model and a preference dataset (``--dataset trl-lib/ultrafeedback_binarized``)
where there is network::

    python examples/dpo_packing.py                                     # a CPU, or one GPU
    torchrun --nproc-per-node 4 examples/dpo_packing.py --model Qwen/Qwen2.5-0.5B-Instruct --dataset ...
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from offline_data import OFFLINE_DATASET, load_conversations, load_model, load_tokenizer

from packing_collators import PackingDPOTrainer


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama", help="hub name or path of a causal LM (default: offline)")
    parser.add_argument("--dataset", default=OFFLINE_DATASET, help="a hub preference dataset (prompt/chosen/rejected, "
                        "any format TRL takes); default: offline python-docs pairs")  # fmt: skip
    parser.add_argument("--split", default="train")
    parser.add_argument("--max-pairs", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=512, help="each prompt + completion cut to this")
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per micro-batch (per process)")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--loss-type", default="sigmoid", help="any loss_type of TRL's DPOConfig")
    parser.add_argument("--share-prompt", action="store_true", help="compute each pair's prompt once")
    parser.add_argument("--max-tokens-per-batch", type=int, default=None, help="whole pairs fill this many tokens")
    parser.add_argument("--attn-implementation", default="sdpa")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def offline_pairs(max_pairs: int):
    """python-docs conversations as pairs: the user's question, its answer (chosen), the next one's (rejected)."""
    import datasets

    rows = load_conversations(OFFLINE_DATASET, max_examples=max_pairs + 1)["messages"]
    pairs = [
        {"prompt": [rows[i][0]], "chosen": [rows[i][1]], "rejected": [rows[i + 1][1]]} for i in range(len(rows) - 1)
    ]
    return datasets.Dataset.from_list(pairs)


def main() -> None:
    from trl import DPOConfig

    args = arguments()
    gpu = torch.cuda.is_available()
    if args.dataset == OFFLINE_DATASET:
        pairs = offline_pairs(args.max_pairs)
    else:
        import datasets

        pairs = datasets.load_dataset(args.dataset, split=args.split).select(range(args.max_pairs))
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, tokenizer, attn_implementation=args.attn_implementation, max_length=args.max_length,
                       seed=args.seed)  # fmt: skip
    config = DPOConfig(
        output_dir=str(Path(__file__).resolve().parent / ".cache" / "dpo"), per_device_train_batch_size=args.batch_size,
        max_steps=args.max_steps, learning_rate=args.lr, beta=args.beta, loss_type=[args.loss_type],
        max_length=args.max_length, logging_steps=max(1, args.max_steps // 4), save_strategy="no", report_to="none",
        seed=args.seed, use_cpu=not gpu, bf16=gpu, lr_scheduler_type="constant",
    )  # fmt: skip
    trainer = PackingDPOTrainer(
        model=model, ref_model=copy.deepcopy(model) if args.model == "tiny-llama" else None, args=config,
        train_dataset=pairs, processing_class=tokenizer, share_prompt=args.share_prompt,
        max_tokens_per_batch=args.max_tokens_per_batch,
    )  # fmt: skip
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    logs = [entry for entry in trainer.state.log_history if "rewards/margins" in entry]
    if trainer.is_world_process_zero():
        print(f"\n== PackingDPOTrainer{' (shared prompts)' if args.share_prompt else ''} ==")
        print(f"pairs: {len(pairs):,}; optimizer steps: {trainer.state.global_step}; {seconds:.1f} s")
        print(f"tokens (as padded pairs hold them): {logs[-1]['num_tokens']:,.0f}; tokens/s {logs[-1]['num_tokens'] / seconds:,.0f}")
        for entry in logs:
            print(f"step {entry['step']:>4}: loss {entry['loss']:.4f}  rewards/margins {entry['rewards/margins']:+.4f}  "
                  f"rewards/accuracies {entry['rewards/accuracies']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
