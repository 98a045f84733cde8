"""PackingTrainer and GPU memory: max_tokens_per_batch="auto" and the memory check before the first step.

The dry runs need a GPU (measured on H100s by the one-off memory_budget.py, see docs/benchmarks.md); here the model's
GPU and its measured peaks are faked, and what the trainer does with them is checked.
"""

from __future__ import annotations

import time

import pytest
import torch
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import PackingTrainer, TokenBudget
from packing_collators.budget import _memory_budget, _trainer_budget
from packing_collators.trainer import _gpu_run

datasets = pytest.importorskip("datasets")
from transformers import TrainerCallback  # noqa: E402

GIB = 1 << 30
LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4]


class StepCounter(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def trainer(tmp_path, **options):
    dataset = datasets.Dataset.from_list(random_examples(LENGTHS, seed=7))
    return PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset, packing_probe=False, **options
    )


class Calls(list):
    """The (tokens, longest, optimizer states) of each dry run, and the autocast dtype of each in ``autocasts``."""

    def __init__(self):
        super().__init__()
        self.autocasts = []
        self.losses = []  # the loss each dry run computes (batch -> loss)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The model counts as on a GPU of 80 GiB; ``peaks[tokens]`` is a step's peak (None: out of memory)."""
    peaks, calls = {}, Calls()
    monkeypatch.setattr(_gpu_run, "memory_model", lambda trainer: probe(trainer))
    monkeypatch.setattr(_memory_budget, "_on_gpu", lambda model, caller, states: (2, 4 * GIB, 80 * GIB))

    def peak_bytes(model, tokens, longest, states=0, autocast_dtype=None, loss=None):
        calls.append((tokens, longest, states))
        calls.autocasts.append(autocast_dtype)
        calls.losses.append(loss)
        return peaks.get(tokens, 10 * GIB)

    monkeypatch.setattr(_memory_budget, "_peak_bytes", peak_bytes)
    return peaks, calls


def probe(trainer):
    return trainer.model


def test_a_budget_over_the_gpu_memory_is_refused_before_the_first_step_with_the_numbers(tmp_path, fake_gpu):
    peaks, calls = fake_gpu
    peaks[64] = None  # a step of 64 tokens runs out of memory
    counter = StepCounter()
    run = trainer(tmp_path, max_tokens_per_batch=64, callbacks=[counter])
    with pytest.raises(
        ValueError,
        match=r"max_tokens_per_batch=64 does not fit this GPU \(80.00 GiB\): a training step "
        r"on 64 tokens \(examples of 15\) ran out of memory\. Lower max_tokens_per_batch",
    ):
        run.train()
    assert counter.steps == 0 and run.state.global_step == 0
    assert calls == [(64, 15, 2)]  # the training budget, the longest example, AdamW's two states


def test_a_step_past_the_memory_share_is_refused_with_its_peak(tmp_path, fake_gpu):
    peaks, _ = fake_gpu
    peaks[64] = 70 * GIB  # + 4 GiB of states = 92.5% of 80 GiB
    with pytest.raises(
        ValueError,
        match=r"peaks at 70.00 GiB plus 4.00 GiB of optimizer states, 92.5% of the card.*memory_check=False \(PackingTrainer, PackingDPOTrainer\) skips",
    ):
        trainer(tmp_path, max_tokens_per_batch=64).train()


def test_a_budget_that_fits_is_checked_once_and_trains(tmp_path, fake_gpu):
    _, calls = fake_gpu
    counter = StepCounter()
    run = trainer(tmp_path, max_tokens_per_batch=64, callbacks=[counter])
    run.train()
    assert counter.steps == run.state.global_step > 0
    assert calls == [(64, 15, 2)]


def test_the_memory_check_can_be_turned_off(tmp_path, fake_gpu):
    peaks, calls = fake_gpu
    peaks[64] = None
    trainer(tmp_path, max_tokens_per_batch=64, memory_check=False).train()
    assert calls == []


def test_on_a_cpu_the_memory_check_is_skipped_and_auto_is_refused(tmp_path):
    trainer(tmp_path, max_tokens_per_batch=64).train()  # nothing to measure on a CPU: trains as before
    with pytest.raises(
        ValueError,
        match=r"max_tokens_per_batch='auto' measures the model's memory on its GPU.*"
        r"Pass a number of tokens instead",
    ):
        trainer(tmp_path / "auto", max_tokens_per_batch="auto").train()


@pytest.fixture
def measured(monkeypatch):
    """measure_token_budget replaced by one that says 48 tokens; the list of ``longest`` it was asked for."""
    asked = []

    def measure(model, *, longest, **options):
        asked.append(longest)
        return TokenBudget(48, longest, GIB, 1e6, 0, 80 * GIB, 0.9)

    monkeypatch.setattr(_memory_budget, "measure_token_budget", measure)
    return asked


def test_auto_uses_the_measured_budget_for_the_longest_example(tmp_path, fake_gpu, measured):
    _, calls = fake_gpu
    run = trainer(tmp_path, max_tokens_per_batch="auto")
    loader = run.get_train_dataloader()
    assert run._train_batch_sampler.max_tokens_per_batch == 48
    assert measured == [15]  # the longest training example
    assert calls == []  # a measured budget is not checked again
    assert all(sum(LENGTHS[i] for i in batch) <= 48 for batch in run._train_batch_sampler)
    assert len(loader) > 0


def test_auto_stops_at_its_ceiling_where_far_more_would_fit(tmp_path, fake_gpu):
    # 10 GiB flat (the fake's default peak): the line allows any size. "auto" dry-runs nothing past its ceiling
    # and trains at it; a bigger micro-batch would train no faster, only dry-run and warm up for longer.
    from packing_collators.budget._trainer_budget import AUTO_CEILING

    peaks, calls = fake_gpu
    peaks[30] = 10 * GIB + 15 * (1 << 10)  # 1 KiB per token: the line says ~60M tokens
    run = trainer(tmp_path, max_tokens_per_batch="auto")
    run.get_train_dataloader()
    assert run._train_batch_sampler.max_tokens_per_batch == AUTO_CEILING == 262_144
    assert [tokens for tokens, _, _ in calls] == [15, 30, AUTO_CEILING]  # the ceiling measured to fit, nothing past it


def test_auto_is_the_only_word_max_tokens_per_batch_takes(tmp_path):
    with pytest.raises(
        ValueError, match=r"max_tokens_per_batch must be a positive integer or None .*'auto'.*got 'max'"
    ):
        trainer(tmp_path, max_tokens_per_batch="max")


def test_the_dry_run_autocasts_as_the_trainer_trains(tmp_path, fake_gpu):
    # float32 weights with bf16=True: a flash kernel takes only the bf16 activations autocast makes,
    # so a dry run without autocast would crash (or measure float32 activations training never holds).
    _, calls = fake_gpu
    dataset = datasets.Dataset.from_list(random_examples(LENGTHS, seed=7))
    run = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, bf16=True),
        train_dataset=dataset,
        packing_probe=False,
        max_tokens_per_batch=64,
    )
    run.get_train_dataloader()
    assert calls == [(64, 15, 2)] and calls.autocasts == [torch.bfloat16]


def test_the_forward_of_a_dry_run_runs_under_autocast(monkeypatch):
    from packing_collators.budget._memory_budget import _peak_bytes

    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *args, **kwargs: GIB)
    model, seen = tiny_model(), []
    model.register_forward_pre_hook(lambda module, args: seen.append(torch.is_autocast_enabled("cpu")))
    _peak_bytes(model, 64, 32, 2, torch.bfloat16)
    _peak_bytes(model, 64, 32, 0, None)
    assert seen == [True, True, False]


def test_auto_measures_once_so_evaluation_during_training_reuses_it(tmp_path, fake_gpu, measured):
    # Measuring again at the first evaluate() would run a training step beside AdamW's real states.
    run = trainer(tmp_path, max_tokens_per_batch="auto", eval_packing="multipack")
    run.eval_dataset = datasets.Dataset.from_list(random_examples([3, 30, 5], seed=8))
    run.get_train_dataloader()
    run.get_eval_dataloader()
    assert measured == [15]


def test_a_rank_whose_measurement_failed_makes_every_rank_refuse(tmp_path, fake_gpu, monkeypatch):
    # Every rank reaches the collective; a rank told by it that another failed raises too, instead of hanging.
    monkeypatch.setattr(_trainer_budget, "_smallest_over_ranks", lambda value, device: 0)
    with pytest.raises(ValueError, match=r"max_tokens_per_batch=64 does not fit another rank's GPU"):
        trainer(tmp_path, max_tokens_per_batch=64).get_train_dataloader()
    monkeypatch.setattr(
        _memory_budget, "measure_token_budget", lambda model, **options: TokenBudget(48, 15, GIB, 1e6, 0, 80 * GIB, 0.9)
    )
    with pytest.raises(ValueError, match=r"another rank could not fit one example of 15 tokens"):
        trainer(tmp_path / "auto", max_tokens_per_batch="auto").get_train_dataloader()


def test_only_a_model_whole_on_one_gpu_is_measured(tmp_path, monkeypatch):
    from types import SimpleNamespace

    run = trainer(tmp_path, max_tokens_per_batch=64)
    assert _gpu_run.memory_model(run) is None  # on a CPU

    def placed(*devices):  # a stand-in model whose parameters sit on these devices
        params = [SimpleNamespace(device=torch.device(*d)) for d in devices]
        return SimpleNamespace(parameters=lambda: iter(params))

    whole, split = placed(("cuda", 0), ("cuda", 0)), placed(("cuda", 0), ("cuda", 1))
    monkeypatch.setattr(_gpu_run, "probe_module", lambda model: model)
    run.model = whole
    assert _gpu_run.memory_model(run) is whole
    run.model = split  # device_map over two GPUs: the first GPU would be charged every parameter's states
    assert _gpu_run.memory_model(run) is None
    run.model, run.is_model_parallel = whole, True
    assert _gpu_run.memory_model(run) is None


def test_the_dry_run_computes_the_loss_training_computes(tmp_path, fake_gpu):
    # the memory model behind "auto" and the check must hold what a step holds: the chunked loss, no full logits
    _, calls = fake_gpu
    trainer(tmp_path, max_tokens_per_batch=64).get_train_dataloader()
    trainer(tmp_path / "full", max_tokens_per_batch=64, loss_implementation="full").get_train_dataloader()
    chunked, full = calls.losses
    assert chunked.__qualname__ == "training_loss.<locals>.loss" and full.__qualname__ == "training_loss.<locals>.<lambda>"
    from packing_collators import FlatteningCollator
    from packing_collators.loss import training_loss

    model, heads = tiny_model(), []
    model.lm_head.register_forward_hook(lambda module, args, out: heads.append(tuple(out.shape)))
    loss = training_loss(model)  # what the chunked closure computes: the head hands back no logits
    heads.clear()
    value = loss(FlatteningCollator()(random_examples([9, 6])))
    assert heads == [(1, 15, 0)] and value.requires_grad


def test_what_runs_before_the_first_step_is_timed_part_by_part_and_logged(tmp_path, fake_gpu, monkeypatch, caplog):
    # the memory check's dry runs take 0.05 s here: the clock puts them in the budget's part, not elsewhere
    dry_run = _memory_budget._peak_bytes
    monkeypatch.setattr(_memory_budget, "_peak_bytes", lambda *a, **k: (time.sleep(0.05), dry_run(*a, **k))[1])
    run = trainer(tmp_path, max_tokens_per_batch=64)
    with caplog.at_level("INFO", logger="packing_collators"):
        run.train()
    parts = run.startup_seconds
    assert parts["token_budget"] >= 0.05 and parts["checks_and_probe"] > 0
    assert "fa4_warm_up" not in parts and "compile" not in parts  # sdpa and eager: neither runs
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Before the first step")]
    assert len(logged) == 1 and "token_budget 0." in logged[0]  # once, at the first step
