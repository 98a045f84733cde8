"""What the RL tests share: TRL's side and ours on the same prompts, rewards and seed, their logs compared.

``_run`` trains two steps (SGD: Adam's first step moves every weight by about lr * sign(gradient), so a gradient
element within float32 noise of 0 would move by 2 * lr on one side and not the other; SGD's step 2 measures the
numbers themselves); ``_compare`` runs TRL's trainer once per set-up and ours, and asserts every logged metric
within 1e-4 relative and every forward that computes gradients on one packed (1, T) row.
"""

from __future__ import annotations

import pytest
import torch
from _words import word_tokenizer

SKIPPED_METRICS = ("step_time",)  # wall-clock


def _reward_length(completions, **kwargs):
    return [float(len(c.split())) for c in completions]


def _reward_words(completions, **kwargs):  # a second reward, so rewards differ within a group
    return [float(sum(word.endswith(("1", "3", "7")) for word in c.split())) for c in completions]


def _prompts(count: int = 8):
    import datasets

    return datasets.Dataset.from_list(
        [{"prompt": " ".join(f"w{(5 * i + 3 * j) % 60}" for j in range(3 + (2 * i) % 7))} for i in range(count)]
    )


def _run(tmp_path, checkpoint, trainer_class, *, trainer_options=None, rloo=False, **options):
    if rloo:
        from trl import RLOOConfig as Config
    else:
        from trl import GRPOConfig as Config

    # SGD: Adam's first step moves every weight by about lr * sign(gradient), so a gradient element within float32
    # noise of 0 would move by 2 * lr on one side and not the other; SGD's step 2 measures the numbers themselves
    base = dict(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                optim="sgd", learning_rate=0.05, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
                disable_tqdm=True, max_completion_length=8, bf16=False, beta=0.1)  # fmt: skip
    trainer = trainer_class(model=str(checkpoint), reward_funcs=[_reward_length, _reward_words],
                            args=Config(**{**base, **options}), train_dataset=_prompts(),
                            processing_class=word_tokenizer(), **(trainer_options or {}))  # fmt: skip
    shapes = []

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if torch.is_grad_enabled() and ids is not None:
            shapes.append(tuple(ids.shape))

    trainer.model.register_forward_pre_hook(record, with_kwargs=True)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry and "train_runtime" not in entry]
    return logs, shapes, trainer


_TRLS_LOGS: dict = {}


def _trls_logs(tmp_path, checkpoint, trainer_class, **options):
    """TRL's logs of a set-up, run once for the tests that compare against it (with and without share_prompt)."""
    key = (str(checkpoint), trainer_class.__name__, repr(sorted(options.items())))
    if key not in _TRLS_LOGS:
        _TRLS_LOGS[key] = _run(tmp_path, checkpoint, trainer_class, **options)[0]
    return _TRLS_LOGS[key]


def _assert_same_logs(theirs, ours, loss_abs: float = 1e-6, grad_norm_rel: float = 1e-4):
    assert len(theirs) == len(ours) == 2
    for step, (a, b) in enumerate(zip(theirs, ours)):
        assert set(a) == set(b)
        for key, value in a.items():
            if key in SKIPPED_METRICS or not isinstance(value, float):
                continue
            bound = loss_abs if key == "loss" else 1e-6
            rel = grad_norm_rel if key == "grad_norm" else 1e-4
            assert b[key] == pytest.approx(value, rel=rel, abs=bound), f"step {step + 1}: {key} {b[key]} vs TRL {value}"


def _compare(tmp_path, checkpoint, share_prompt, *, rloo=False, both=None, grad_norm_rel=1e-4, loss_abs=None, **options):
    """``both``: trainer options both sides take (``peft_config``), run on TRL's side each time; ``grad_norm_rel``:
    the gradient norm's bound (bf16 weights accumulate their gradients in bf16, in another order when shared);
    ``loss_abs``: the loss's absolute bound (default 1e-5 for RLOO, whose advantages sum to 0 in a group)."""
    from trl import GRPOTrainer, RLOOTrainer

    from packing_collators import PackingGRPOTrainer, PackingRLOOTrainer

    if both:
        theirs = _run(tmp_path / "trl", checkpoint, RLOOTrainer if rloo else GRPOTrainer, trainer_options=both,
                      rloo=rloo, **options)[0]  # fmt: skip
    else:
        theirs = _trls_logs(tmp_path / "trl", checkpoint, RLOOTrainer if rloo else GRPOTrainer, rloo=rloo, **options)
    ours, shapes, trainer = _run(tmp_path / "packed", checkpoint, PackingRLOOTrainer if rloo else PackingGRPOTrainer,
                                 trainer_options={"share_prompt": share_prompt, **(both or {})}, rloo=rloo,
                                 **options)  # fmt: skip
    # RLOO's leave-one-out advantages sum to 0 in each group: its loss is float32 rounding of terms near 1 (measured
    # 1.2e-6 against TRL's -1.2e-7 on torch 2.6), while grad_norm and the rest still agree within 1e-4
    loss_abs = loss_abs if loss_abs is not None else 1e-5 if rloo else 1e-6
    _assert_same_logs(theirs, ours, loss_abs=loss_abs, grad_norm_rel=grad_norm_rel)
    assert shapes and all(shape[0] == 1 for shape in shapes), f"a training forward saw padded rows: {set(shapes)}"
    return shapes, trainer


