"""The DeepSpeed config checks, without deepspeed installed: what keeps packing exact, refused before training."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import PackingTrainer
from packing_collators.trainer._deepspeed import check_deepspeed_config, check_deepspeed_setup, deepspeed_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIZES = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=2)


@pytest.mark.parametrize("name", ["ds_zero2.json", "ds_zero3.json"])
def test_the_example_configs_pass_and_leave_the_batch_numbers_to_transformers(name):
    config = json.loads((EXAMPLES / name).read_text())
    assert config["zero_optimization"]["stage"] == int(name[-6])
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        assert config[key] == "auto"
    trainer = SimpleNamespace(args=SimpleNamespace(deepspeed=str(EXAMPLES / name), **SIZES))
    assert deepspeed_config(trainer) == config
    check_deepspeed_setup(trainer)


@pytest.mark.parametrize("key", ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"])
def test_numbers_pass_exactly_when_equal_to_what_auto_fills(key):
    filled = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": 16}
    assert check_deepspeed_config(filled, **SIZES) is None  # 4 per rank x 2 steps x 2 ranks: what "auto" gives
    for off in (filled[key] - 1, filled[key] + 1):  # one off either way is refused, naming the key
        with pytest.raises(ValueError, match=rf"has {key}={off}"):
            check_deepspeed_config({**filled, key: off}, **SIZES)


@pytest.mark.parametrize(
    "config, match",
    [
        ({"gradient_accumulation_steps": 4}, "gradient_accumulation_steps=4, but TrainingArguments has gradient_accumulation_steps=2"),
        ({"train_micro_batch_size_per_gpu": 16}, "train_micro_batch_size_per_gpu=16, but PackingTrainer's micro-batches are planned by its sampler"),
        ({"train_batch_size": 64}, "train_batch_size=64, but 2 rank\\(s\\) x 4 x 2 accumulation steps is 16"),
        ({"curriculum_learning": {"enabled": True}}, 'enables "curriculum_learning", DeepSpeed\'s own data pipeline'),
        ({"data_efficiency": {"enabled": True}}, 'Set "data_efficiency": {"enabled": false}'),
    ],
)
def test_a_config_that_makes_packing_inexact_is_refused_with_the_fix(config, match):
    with pytest.raises(ValueError, match=match):
        check_deepspeed_config(config, **SIZES)


def test_packing_trainer_checks_the_deepspeed_config_at_construction(tmp_path):
    import datasets

    args = training_args(tmp_path)
    args.deepspeed = {"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": 8}  # as a user wrote it
    train = datasets.Dataset.from_list(random_examples([5, 7, 3], seed=0))
    with pytest.raises(ValueError, match='Set "gradient_accumulation_steps": "auto" in the DeepSpeed config'):
        PackingTrainer(model=tiny_model("llama"), args=args, train_dataset=train, max_tokens_per_batch=16)


def test_no_deepspeed_no_config():
    trainer = SimpleNamespace(args=SimpleNamespace(deepspeed=None), is_deepspeed_enabled=False)
    assert deepspeed_config(trainer) is None
    check_deepspeed_setup(trainer)


def test_the_flash_attention_4_warm_up_is_skipped_under_deepspeed(monkeypatch, tmp_path):
    # the warm-up's backward runs outside DeepSpeed's engine, whose gradient hooks would keep its gradients
    from packing_collators.trainer import _check_callback
    from packing_collators.trainer._check_callback import _AttentionWarmUp

    calls = []
    monkeypatch.setattr(_check_callback, "run_warm_up", lambda model, layouts, **k: calls.append(max(map(max, layouts))))
    trainer = PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=random_examples([5, 20, 9, 3]),
        max_tokens_per_batch=32, attn_implementation=None,
    )
    trainer.get_train_dataloader()
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_4"
    trainer.is_deepspeed_enabled = True
    callback = _AttentionWarmUp(trainer)
    callback.on_train_begin(None, None, None, model=model)
    assert calls == [] and callback.seconds is None
    trainer.is_deepspeed_enabled = False
    callback.on_train_begin(None, None, None, model=model)
    assert calls == [20]
