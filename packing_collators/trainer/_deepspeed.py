"""DeepSpeed ZeRO under PackingTrainer: the config checks that keep packing exact.

The sampler owns the micro-batches (up to ``max_tokens_per_batch`` tokens, a varying number
of examples) and the Trainer owns the optimizer step (``gradient_accumulation_steps``
micro-batches, their target tokens counted into ``num_items_in_batch``). A DeepSpeed config
agrees when its batch numbers are ``"auto"`` (transformers fills them from
``TrainingArguments``, see ``HfTrainerDeepSpeedConfig.trainer_config_process``) or equal to
what ``"auto"`` fills::

    "train_micro_batch_size_per_gpu": "auto"   <- per_device_train_batch_size
    "gradient_accumulation_steps":    "auto"   <- gradient_accumulation_steps
    "train_batch_size":               "auto"   <- world_size * micro * accumulation

Refused before training: another number there (DeepSpeed would step the optimizer at
another boundary than the one the loss is normalised over, or count examples the sampler
does not batch), and DeepSpeed's own data pipeline (``curriculum_learning``,
``data_efficiency``), which would reorder or truncate the packed examples. Under DeepSpeed,
as under FSDP, the memory check and ``max_tokens_per_batch="auto"`` do not run (the model
is sharded); the live probe runs its forwards on every rank (``on_train_begin`` runs on all
of them, and ZeRO-3 gathers each layer's parameters in its forward hooks); the
FlashAttention-4 warm-up, a backward outside DeepSpeed's engine, is skipped (its gradient
hooks would keep the warm-up's gradients). Cost: one read of the config at construction.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["check_deepspeed_config", "deepspeed_config"]

AUTO = "auto"
_DATA_PIPELINES = ("curriculum_learning", "data_efficiency")


def deepspeed_config(trainer) -> dict | None:
    """The DeepSpeed config a Trainer runs with, as the user wrote it where it can be read; None without DeepSpeed.

    ``TrainingArguments(deepspeed=...)`` keeps the user's dict or file path (transformers fills
    ``"auto"`` in a copy); under ``accelerate launch --use_deepspeed`` the plugin's config is read.
    """
    args = trainer.args
    source = getattr(args, "deepspeed", None)
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, str) and os.path.isfile(source):
        with open(source) as file:
            return json.load(file)
    filled = getattr(getattr(args, "hf_deepspeed_config", None), "config", None)  # a JSON/base64 string, read
    if filled is not None:
        return dict(filled)
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return None
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return dict(getattr(plugin, "deepspeed_config", None) or {})


def _number(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key, AUTO)
    return None if value in (AUTO, None) else int(value)


def _refuse_unless(config: Mapping[str, Any], key: str, expected: int, why) -> int | None:
    """The config's number for ``key`` (None for "auto"); a ValueError, ending with ``why(value)``, if not ``expected``."""
    value = _number(config, key)
    if value is not None and value != expected:
        raise ValueError(f"The DeepSpeed config has {key}={value}, but {why(value)}")
    return value


def check_deepspeed_config(
    config: Mapping[str, Any], *, per_device_train_batch_size: int, gradient_accumulation_steps: int, world_size: int
) -> None:
    """Raise a ValueError for a DeepSpeed config under which PackingTrainer's loss or batches would not be exact.

    >>> check_deepspeed_config({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    ...                         "zero_optimization": {"stage": 3}}, per_device_train_batch_size=8,
    ...                        gradient_accumulation_steps=4, world_size=2)
    >>> check_deepspeed_config({"gradient_accumulation_steps": 8}, per_device_train_batch_size=8,
    ...                        gradient_accumulation_steps=4, world_size=2)
    Traceback (most recent call last):
    ...
    ValueError: The DeepSpeed config has gradient_accumulation_steps=8, but TrainingArguments has gradient_accumulation_steps=4: DeepSpeed would step the optimizer every 8 micro-batches while the Trainer normalises the loss (num_items_in_batch) over 4, so a step's loss would not be the mean over its tokens. Set "gradient_accumulation_steps": "auto" in the DeepSpeed config (transformers fills it from TrainingArguments).
    """
    accumulation = gradient_accumulation_steps
    _refuse_unless(
        config, "gradient_accumulation_steps", accumulation,
        lambda value: f"TrainingArguments has gradient_accumulation_steps={accumulation}: DeepSpeed would step the "
        f"optimizer every {value} micro-batches while the Trainer normalises the loss (num_items_in_batch) over "
        f"{accumulation}, so a step's loss would not be the mean over its tokens. Set "
        '"gradient_accumulation_steps": "auto" in the DeepSpeed config (transformers fills it from TrainingArguments).',
    )  # fmt: skip
    micro = _refuse_unless(
        config, "train_micro_batch_size_per_gpu", per_device_train_batch_size,
        lambda value: "PackingTrainer's micro-batches are planned by its sampler (up to max_tokens_per_batch tokens, "
        f"a varying number of examples; per_device_train_batch_size={per_device_train_batch_size} only sizes the "
        'default budget), so DeepSpeed cannot own that number. Set "train_micro_batch_size_per_gpu": "auto" in the '
        "DeepSpeed config, and max_tokens_per_batch= on PackingTrainer for the micro-batch size.",
    )  # fmt: skip
    micro = micro or per_device_train_batch_size
    expected = world_size * micro * accumulation
    _refuse_unless(
        config, "train_batch_size", expected,
        lambda value: f"{world_size} rank(s) x {micro} x {accumulation} accumulation steps is {expected}: DeepSpeed "
        "would derive another accumulation count than the Trainer's, and PackingTrainer's steps are counted in "
        'tokens, not examples. Set "train_batch_size": "auto" in the DeepSpeed config.',
    )  # fmt: skip
    for key in _DATA_PIPELINES:
        section = config.get(key)
        if isinstance(section, Mapping) and section.get("enabled", False):
            raise ValueError(
                f'The DeepSpeed config enables "{key}", DeepSpeed\'s own data pipeline, which reorders or truncates '
                "examples after PackingTrainer's sampler planned its micro-batches (the packed batches would no longer "
                f'be the planned ones). Set "{key}": {{"enabled": false}}, or train with Trainer and your own batches.'
            )


def check_deepspeed_setup(trainer) -> None:
    """:func:`check_deepspeed_config` on the Trainer's DeepSpeed config, if it runs under DeepSpeed."""
    config = deepspeed_config(trainer)
    if config is None:
        return
    args = trainer.args
    check_deepspeed_config(
        config,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        world_size=args.world_size,
    )
