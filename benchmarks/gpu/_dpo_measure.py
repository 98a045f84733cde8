"""What dpo_throughput.py measures per step, the same in every setting: vs_trl's StepRecorder, counting pairs.

    trainer.data_collator  ->  PairCounter: the collated batch also carries its pairs' numbers (BENCH_KEY), read
                               from the pairs themselves, not from the layout: real tokens = sum of |P C| + |P R|
                               (each cut to max_length, keep_start), prompt tokens, pairs, a token-id checksum
    trainer.training_step  ->  PairStepRecorder: pops BENCH_KEY, adds the tokens the model ran (input_ids.numel():
                               padded for TRL, the row for packed, the shorter row for shared), keeps the loss
    StepRecorder            ->  the clock at each optimizer step's start and end, peak memory (_vs_trl_measure.py)

So every setting is credited with the same real tokens for the same pairs: a shared-prompt row runs fewer tokens
(``model_tokens``) and its tokens/s shows the saved prompt work. ``logged_metrics`` reads what the trainer logged
at every step (``logging_steps=1``): TRL's names (rewards/*, logps/*, logits/*, entropy, ...) on every side.
"""

from __future__ import annotations

import numpy as np
from _vs_trl_measure import StepRecorder, _number

BENCH_KEY = "dpo_benchmark_pairs"  # taken out of the batch before the trainer's step sees it


def pair_numbers(features, max_length: int | None) -> dict:
    """The pairs' numbers: ``tokens`` (|P C| + |P R| each cut to ``max_length``), ``prompt_tokens``, ``examples``
    (pairs) and ``checksum`` (each sequence's ids weighted by position, summed: the same pairs give the same sum).

    >>> pair_numbers([{"prompt_ids": [5, 6], "chosen_ids": [7], "rejected_ids": [8, 9]}], None)
    {'tokens': 7, 'prompt_tokens': 2, 'examples': 1, 'checksum': 115}
    >>> pair_numbers([{"prompt_ids": [5, 6], "chosen_ids": [7], "rejected_ids": [8, 9]}], 3)["tokens"]
    6
    """
    tokens = prompt_tokens = checksum = 0
    for pair in features:
        prompt = list(pair["prompt_ids"])
        prompt_tokens += len(prompt)
        for key in ("chosen_ids", "rejected_ids"):
            ids = np.asarray((prompt + list(pair[key]))[:max_length], dtype=np.int64)
            tokens += len(ids)
            checksum += int((ids * (np.arange(len(ids)) % 1009 + 1)).sum())
    return {"tokens": tokens, "prompt_tokens": prompt_tokens, "examples": len(features), "checksum": checksum}


class PairCounter:
    """A trainer's collator, unchanged, whose batches also carry ``pair_numbers`` under BENCH_KEY.

    Any other attribute (``max_length``, ``sequences``, ...) is the wrapped collator's, so the trainer's own uses of
    its collator (PackingDPOTrainer's checks, its budget loader) see the collator they built."""

    def __init__(self, collator, max_length: int | None) -> None:
        self.collator, self.max_length = collator, max_length

    def __getattr__(self, name: str):
        if name == "collator":  # not set yet (a copy being built)
            raise AttributeError(name)
        return getattr(self.collator, name)

    def __call__(self, features):
        batch = self.collator(features)
        batch[BENCH_KEY] = pair_numbers(features, self.max_length)
        return batch


class PairStepRecorder(StepRecorder):
    """StepRecorder whose steps count pairs (see the module docstring); ``attach`` before ``train()``."""

    def attach(self, trainer, max_length: int | None = None) -> None:
        trainer.data_collator = PairCounter(trainer.data_collator, max_length)
        inner = trainer.training_step

        def training_step(model, inputs, *args, **kwargs):
            numbers = dict(inputs.pop(BENCH_KEY))
            numbers["model_tokens"] = inputs["input_ids"].numel()
            loss = inner(model, inputs, *args, **kwargs)
            self._micro.append({**numbers, "loss": loss.detach()})
            return loss

        trainer.training_step = training_step  # the Trainer calls self.training_step: this instance's wins
        trainer.add_callback(self._callback())

    def steps(self) -> list[dict]:
        """StepRecorder's steps (tokens: the pairs' real tokens; examples: pairs), + model_tokens, prompt_tokens."""
        steps = super().steps()
        for step, raw in zip(steps, self.raw):
            for key in ("model_tokens", "prompt_tokens"):
                step[key] = int(sum(_number(m[key]) for m in raw["micro"]))
        return steps


def logged_metrics(trainer) -> dict[int, dict]:
    """step -> the numbers the trainer logged at that step (its log_history; the run's summary left out)."""
    logged = {}
    for entry in trainer.state.log_history:
        if "step" in entry and "train_runtime" not in entry:
            numbers = {k: float(v) for k, v in entry.items() if isinstance(v, (int, float)) and k != "step"}
            logged.setdefault(int(entry["step"]), {}).update(numbers)
    return logged
