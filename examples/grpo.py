"""RL post-training (GRPO) on packed rows: PackingGRPOTrainer, TRL's GRPOTrainer scoring completions unpadded.

One line changes from a TRL GRPO script: ``GRPOTrainer`` becomes ``PackingGRPOTrainer``. TRL generates, rewards
and computes every loss type as it always does; each forward that scores the completions (the policy's, the
reference's, the old policy's) runs on one packed row of the micro-batch's real tokens::

    trainer = PackingGRPOTrainer(model=model, reward_funcs=[reward], args=GRPOConfig(...), train_dataset=prompts,
                                 processing_class=tokenizer, share_prompt=True)

``--share-prompt`` lays each prompt once for its group of ``--num-generations`` completions (each completion
attends to the prompt and itself). Defaults run offline in seconds on a CPU: the tiny model and python-docs
questions of ``offline_data.py``, rewarded for answers near ``--target-length`` tokens. Where there is network,
pass a hub model and a prompt dataset::

    python examples/grpo.py                                   # a CPU, or one GPU
    python examples/grpo.py --model Qwen/Qwen3-0.6B --dataset trl-lib/DeepMath-103K --max-completion-length 512
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from offline_data import OFFLINE_DATASET, OFFLINE_MODEL, load_conversations, load_model, load_tokenizer

from packing_collators import PackingGRPOTrainer


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=OFFLINE_MODEL, help="hub name or path of a causal LM (default: offline)")
    parser.add_argument("--dataset", default=OFFLINE_DATASET, help="a hub dataset with a 'prompt' column")
    parser.add_argument("--split", default="train")
    parser.add_argument("--max-prompts", type=int, default=64)
    parser.add_argument("--num-generations", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--batch-size", type=int, default=8, help="completions per micro-batch (a multiple of G)")
    parser.add_argument("--max-completion-length", type=int, default=24)
    parser.add_argument("--target-length", type=int, default=20, help="the offline reward: answers of this many tokens")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.04, help="KL to the reference (0: no reference model)")
    parser.add_argument("--loss-type", default="dapo", help="any loss_type of TRL's GRPOConfig")
    parser.add_argument("--share-prompt", action="store_true", help="compute each prompt once for its group")
    parser.add_argument("--attn-implementation", default="sdpa")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def offline_prompts(max_prompts: int):
    """python-docs questions as conversational prompts (the user's turn of each conversation)."""
    import datasets

    rows = load_conversations(OFFLINE_DATASET, max_examples=max_prompts)["messages"]
    return datasets.Dataset.from_list([{"prompt": [row[0]]} for row in rows])


def length_reward(target: int, tokenizer):
    """A reward for completions of about ``target`` tokens: 1 at the target, falling linearly to 0 at twice it."""

    def reward(completions, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
        return [max(0.0, 1.0 - abs(n - target) / target) for n in lengths]

    reward.__name__ = "length"
    return reward


def main() -> None:
    from trl import GRPOConfig

    args = arguments()
    gpu = torch.cuda.is_available()
    if args.dataset == OFFLINE_DATASET:
        prompts = offline_prompts(args.max_prompts)
    else:
        import datasets

        prompts = datasets.load_dataset(args.dataset, split=args.split).select(range(args.max_prompts))
    tokenizer = load_tokenizer(args.model)
    model = args.model
    if args.model == OFFLINE_MODEL:  # TRL loads the reference from the policy's path: save the tiny model once
        model = Path(__file__).resolve().parent / ".cache" / "grpo-tiny-llama"
        load_model(args.model, tokenizer, attn_implementation=args.attn_implementation, seed=args.seed).save_pretrained(model)
        model = str(model)
    config = GRPOConfig(
        output_dir=str(Path(__file__).resolve().parent / ".cache" / "grpo"), per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length, max_steps=args.max_steps,
        learning_rate=args.lr, beta=args.beta, loss_type=args.loss_type, logging_steps=1, save_strategy="no",
        report_to="none", seed=args.seed, use_cpu=not gpu, bf16=gpu,
        model_init_kwargs={"attn_implementation": args.attn_implementation},
    )  # fmt: skip
    trainer = PackingGRPOTrainer(
        model=model, reward_funcs=[length_reward(args.target_length, tokenizer)], args=config, train_dataset=prompts,
        processing_class=tokenizer, share_prompt=args.share_prompt,
    )  # fmt: skip
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    if trainer.is_world_process_zero():
        print(f"\n== PackingGRPOTrainer{' (shared prompts)' if args.share_prompt else ''} ==")
        print(f"prompts: {len(prompts):,}; completions per prompt: {args.num_generations}; "
              f"optimizer steps: {trainer.state.global_step}; {seconds:.1f} s")  # fmt: skip
        for entry in logs:
            print(f"step {entry['step']:>4}: loss {entry['loss']:+.4f}  reward {entry['reward']:.4f}  "
                  f"kl {entry.get('kl', 0.0):.6f}  entropy {entry['entropy']:.4f}  "
                  f"completion length {entry['completions/mean_length']:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
