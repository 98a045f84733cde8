"""SamplerOptions (sampler/_options.py): the sampler's settings as one frozen object, checked once.

MultipackBatchSampler, plan_epoch and PackingTrainer all check their settings with the same
per-field checks (check_sampler_option), when they are built, and raise the same words.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from _tiny_models import tiny_model, training_args

from packing_collators import MultipackBatchSampler
from packing_collators.sampler import SamplerOptions, check_sampler_option, plan_epoch
from packing_collators.sampler import _options as options_module

BAD = [
    ("max_tokens_per_batch", 0, ValueError, "max_tokens_per_batch must be a positive integer, got 0"),
    ("seed", -1, ValueError, "seed must be an integer >= 0, got -1"),
    ("strategy", "worst_fit", ValueError, "strategy='worst_fit' is not supported; choose one of 'bfd', 'ffd', 'next_fit'"),
    ("group_size", 0, ValueError, "group_size must be a positive integer, got 0"),
    ("balance", "flops", ValueError, "balance='flops' is not supported"),
    ("attention_weight", -1, ValueError, "attention_weight must be a finite number >= 0, got -1"),
    ("overflow", "truncate", ValueError, "overflow='truncate' is not supported; choose one of 'error', 'drop'"),
    ("num_replicas", 0, ValueError, "num_replicas must be a positive integer, got 0"),
    ("progress", "yes", TypeError, "progress must be True, False or None"),
]


@pytest.mark.parametrize("field, value, error, message", BAD, ids=[case[0] for case in BAD])
def test_a_bad_setting_raises_the_same_error_wherever_it_is_given(field, value, error, message):
    given = {"max_tokens_per_batch": 8, field: value}
    with pytest.raises(error, match=message) as from_options:
        SamplerOptions(**given)
    with pytest.raises(error, match=message) as from_sampler:
        MultipackBatchSampler([3, 4], **given)
    with pytest.raises(error, match=message) as from_plan:
        plan_epoch([3, 4], **given)
    assert str(from_options.value) == str(from_sampler.value) == str(from_plan.value)


def test_every_field_has_its_check():
    assert set(options_module._CHECKS) == {field.name for field in dataclasses.fields(SamplerOptions)}


def test_the_options_are_normalised_keyword_only_frozen_and_replaced_with_a_check():
    options = SamplerOptions(max_tokens_per_batch=np.int64(8), shuffle=0, attention_weight=1, seed=np.int32(2))
    assert (options.max_tokens_per_batch, options.shuffle, options.attention_weight, options.seed) == (8, False, 1.0, 2)
    assert type(options.max_tokens_per_batch) is int and type(options.attention_weight) is float
    with pytest.raises(TypeError):
        SamplerOptions(8)  # keyword-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 3
    assert dataclasses.replace(options, seed=3) == SamplerOptions(
        max_tokens_per_batch=8, shuffle=False, attention_weight=1.0, seed=3
    )
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -3"):
        dataclasses.replace(options, seed=-3)


def test_the_sampler_reads_its_settings_from_one_frozen_object():
    sampler = MultipackBatchSampler([3, 4, 5], 8, num_replicas=2, rank=1, seed=4, balance="tokens")
    assert sampler.options == SamplerOptions(max_tokens_per_batch=8, num_replicas=2, seed=4, balance="tokens")
    assert (sampler.seed, sampler.balance, sampler.num_replicas, sampler.max_tokens_per_batch) == (4, "tokens", 2, 8)
    with pytest.raises(AttributeError):
        sampler.seed = 5  # read-only: it would bypass the check and the ranks' agreement
    with pytest.raises(AttributeError):
        sampler.options = SamplerOptions(max_tokens_per_batch=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sampler.options.seed = 5
    plan = plan_epoch([3, 4, 5], 8, num_replicas=2, seed=4, balance="tokens")
    assert sampler.plan().batches(rank=1) == plan.batches(rank=1)
    again = MultipackBatchSampler([3, 4, 5], **dataclasses.asdict(sampler.options), rank=0)
    assert again.options == sampler.options and list(again) == plan.batches(rank=0)


def count_checks(monkeypatch) -> Counter:
    """Count each field's check from now on (the checks themselves still run)."""
    calls: Counter = Counter()
    for field, check in list(options_module._CHECKS.items()):

        def counted(name, value, field=field, check=check):
            calls[field] += 1
            return check(name, value)

        monkeypatch.setitem(options_module._CHECKS, field, counted)
    return calls


def test_the_sampler_checks_each_setting_once_at_construction_not_per_epoch(monkeypatch):
    calls = count_checks(monkeypatch)
    sampler = MultipackBatchSampler(np.arange(1, 40), 64, num_replicas=2, rank=1, progress=None)
    assert calls == Counter({field.name: 1 for field in dataclasses.fields(SamplerOptions)})
    for epoch in range(3):
        sampler.set_epoch(epoch)
        list(sampler)
    sampler.load_state_dict(sampler.state_dict())
    assert set(calls.values()) == {1}  # planning, iterating and resuming check nothing again


def test_the_trainer_checks_its_sampler_options_with_the_sampler_s_checks(monkeypatch, tmp_path):
    from packing_collators import PackingTrainer

    for trainer_option, field, value in [
        ("strategy", "strategy", "best"),
        ("overflow", "overflow", "truncate"),
        ("attention_weight", "attention_weight", -1),
    ]:
        with pytest.raises(ValueError) as from_trainer:
            PackingTrainer(**{trainer_option: value})
        with pytest.raises(ValueError) as from_sampler:
            MultipackBatchSampler([3], 8, **{field: value})
        # the same words: the trainer takes the sampler's options under the sampler's names
        assert str(from_trainer.value) == str(from_sampler.value)
    calls = count_checks(monkeypatch)
    trainer = PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path), strategy="ffd", overflow="drop",
        attention_weight=1,
    )  # fmt: skip
    assert calls == Counter({"strategy": 1, "overflow": 1, "attention_weight": 1})
    assert (trainer.strategy, trainer.overflow, trainer.attention_weight) == ("ffd", "drop", 1.0)
    with pytest.raises(ValueError, match=r"^strategy='best' is not supported; choose one of 'bfd'"):
        check_sampler_option("strategy", "best")
