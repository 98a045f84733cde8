"""PackingTrainer's GPU-memory steps on a real GPU: "auto" budget, refusal before step 1, too-long example.

One model (``_shared.build_model``: Llama-style, bf16, random weights; gradient checkpointing
through ``TrainingArguments`` as a long-context user sets it) on Markov-chain tokens with
``--distribution`` lengths up to ``--max-length``, trained by ``PackingTrainer`` three times:

    auto      max_tokens_per_batch="auto": the trainer measures the budget for the longest example
              before the first step, then trains --steps steps at it. Recorded: the budget, the
              seconds from train() to the first step, the peak memory of the training steps as a
              share of the card, the steps run and their losses.
    over      max_tokens_per_batch = --over x the "auto" budget: memory_check must refuse it before
              the first step (no step begins), with the numbers in its error. Recorded: the error,
              the steps begun (must be 0) and the seconds to the refusal.
    too_long  "auto" with one more example of --too-long tokens in the data: refused before the
              first step, naming the example's length.

Writes OUT/trainer_memory_check.json and prints it; exits 1 if a case did not behave as above.

    python benchmarks/gpu/trainer_memory_check.py --size 1b --max-length 8192 --out OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import build_model, command, lengths_of, markov_tokens  # noqa: E402


def steps_seen():
    """A callback that records when each training step begins (wall time) and the peak memory after it."""
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def __init__(self):
            self.began: list[float] = []
            self.peak = 0

        def on_step_begin(self, args, state, control, **kwargs):
            if not self.began:  # the budget's dry runs are over: measure the training steps alone
                torch.cuda.reset_peak_memory_stats()
            self.began.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.peak = max(self.peak, torch.cuda.max_memory_allocated())

    return Steps()


def trainer_run(model, dataset, budget, args) -> dict:
    from transformers import TrainingArguments

    from packing_collators import PackingTrainer

    steps = steps_seen()
    options = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="trainer_memory_"),
        max_steps=args.steps,
        per_device_train_batch_size=1,
        learning_rate=1e-5,
        gradient_checkpointing=args.grad_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        optim="adamw_torch_fused",
        disable_tqdm=True,
        dataloader_num_workers=2,
    )
    trainer = PackingTrainer(
        model=model, args=options, train_dataset=dataset, max_tokens_per_batch=budget, attn_implementation=None
    )
    trainer.add_callback(steps)
    started = time.perf_counter()
    result: dict = {"max_tokens_per_batch": budget}
    try:
        trainer.train()
        result["error"] = None
    except ValueError as error:
        result["error"] = str(error)
    result["seconds_to_first_step_or_refusal"] = (steps.began[0] if steps.began else time.perf_counter()) - started
    result["steps_begun"] = len(steps.began)
    result["budget_used"] = trainer._auto_budget or (budget if isinstance(budget, int) else None)
    result["losses"] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    total = torch.cuda.get_device_properties(0).total_memory
    result["peak_share_of_card"] = steps.peak / total if steps.began else None
    result["card_gib"] = total / 2**30
    del trainer
    gc.collect()
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1b")
    parser.add_argument("--attn", default="flash_attention_4", help="or packing_varlen")
    parser.add_argument("--distribution", default="long_tail")
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--examples", type=int, default=600)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--over", type=float, default=1.5, help="the refused budget, as a multiple of 'auto'")
    parser.add_argument("--too-long", type=int, default=2_000_000)
    parser.add_argument("--no-grad-checkpointing", dest="grad_checkpointing", action="store_false")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.command = command()
    lengths = lengths_of(args.distribution, args.examples, seed=0, high=args.max_length)
    dataset = [{"input_ids": e} for e in markov_tokens(lengths, 32000, seed=0)]
    model_args = argparse.Namespace(size=args.size, vocab=32000, max_length=args.too_long, seed=0)
    model = build_model(model_args, args.attn, "cuda", torch.bfloat16)

    results = {"command": args.command, "card": torch.cuda.get_device_name(), "longest": int(lengths.max())}
    results["auto"] = auto = trainer_run(model, dataset, "auto", args)
    print(json.dumps(auto, indent=1), flush=True)
    over = int(auto["budget_used"] * args.over) if auto["budget_used"] else 10 * args.max_length
    results["over"] = trainer_run(model, dataset, over, args)
    print(json.dumps(results["over"], indent=1), flush=True)
    too_long = dataset + [{"input_ids": np.random.default_rng(1).integers(0, 32000, args.too_long)}]
    results["too_long"] = trainer_run(model, too_long, "auto", args)
    print(json.dumps(results["too_long"], indent=1), flush=True)

    problems = []
    if auto["error"] or auto["steps_begun"] != args.steps or not (auto["peak_share_of_card"] or 1) <= 0.9:
        problems.append("auto: did not train its steps within 90% of the card")
    for case in ("over", "too_long"):
        if results[case]["error"] is None or results[case]["steps_begun"]:
            problems.append(f"{case}: not refused before the first step")
    if str(args.too_long) not in (results["too_long"]["error"] or "").replace(",", ""):
        problems.append("too_long: the error does not name the example's length")
    results["problems"] = problems
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trainer_memory_check.json").write_text(json.dumps(results, indent=1))
    print("problems:", problems or "none", flush=True)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
