"""Every use of another library's private API, in one place, with the versions it was checked on.

    library        private name                                   used for
    transformers   AttentionInterface._global_mapping             which function an attention name runs
    transformers   PretrainedConfig._attn_implementation          the model's attention implementation
    transformers   Trainer._run_epoch                             set_epoch on a mid-epoch resume
    transformers   Trainer._set_signature_columns_if_needed       keep a pre-packed dataset's columns
    transformers   Trainer._get_num_items_in_batch                targets counted over ranks / shards
    transformers   Trainer._remove_unused_columns,                the stock column dropping, reused
                   Trainer._get_collator_with_removed_columns
    transformers   Trainer._prepare_inputs, _train_batch_size     the compile warm-up's step, the batch size
    transformers   Trainer(model, args, data_collator, ...)       len(args) >= 3: a positional collator
    datasets       iterable_dataset._BaseExamplesIterable,        wrapping a streaming dataset's examples
                   IterableDataset._ex_iterable
    datasets       Dataset._get_cache_file_path, _fingerprint,    cache files of pack_dataset
                   _format_columns, _indices
    datasets       MemoryMappedTable._apply_replays               replaying a memory-mapped table's ops
    flash_attn     cute.interface._flash_attn_fwd / _bwd          FA4's kernels as torch custom ops
    torch          torch._dynamo.utils.counters                   graphs compiled so far
    torch          torch._dynamo.config.recompile_limit           graphs Dynamo keeps per function
                   (cache_size_limit before 2.7)
    torch          torch._dynamo.config.skip_fwd_side_effects_    a checkpointed layer traced whole although
                   in_bwd_under_checkpoint                        its forward sets a global (transformers 5.25)
    CPython        sys._getframe                                  the Trainer that called a callback

Checked on: transformers 5.15.0 (the floor, ``make test-oldest``), 5.17.0 (GPU runs), 5.24.0 and 5.25.0
(CI); datasets 4.8.4 (floor) and 5.2.0; accelerate 1.14.0 (floor) and 1.15.0; flash_attn.cute
4.0.0b36 (GPU runs); torch 2.6.0 (floor), 2.11 (GPU runs) and 2.13 (CI).
A test (tests/test_compat.py) fails if a name above is used anywhere else in the package.
Cost: none; attribute reads.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

__all__ = [
    "BaseExamplesIterable",  # noqa: F822 (module __getattr__: datasets is imported on first use)
    "POSITIONAL_COLLATOR_INDEX",
    "PRIVATE_NAMES",
    "apply_replays",
    "attention_registry",
    "attn_implementation",
    "base_examples_iterable",
    "cache_file_path",
    "caller_frame",
    "checkpoint_side_effects_not_replayed",
    "collator_with_removed_columns",
    "dataset_fingerprint",
    "dataset_indices",
    "examples_iterable",
    "fa4_kernels",
    "dynamo_counters",
    "enable_activation_checkpointing",
    "format_columns",
    "positional_collator",
    "prepared_inputs",
    "remove_unused_columns",
    "set_attn_implementation",
    "set_dataset_fingerprint",
    "train_batch_size",
    "trainer_hooks",
    "trainer_step_inputs",
]

# The private names this module wraps: tests/test_compat.py greps the package for them (not
# ``_fingerprint``: the sampler has a method of its own by that name).
PRIVATE_NAMES = (
    "_global_mapping",
    "_attn_implementation",
    "_run_epoch",
    "_set_signature_columns_if_needed",
    "_signature_columns",
    "_get_num_items_in_batch",
    "_remove_unused_columns",
    "_get_collator_with_removed_columns",
    "_prepare_inputs",
    "_train_batch_size",
    "_BaseExamplesIterable",
    "_ex_iterable",
    "_get_cache_file_path",
    "_format_columns",
    "_apply_replays",
    "_flash_attn_fwd",
    "_flash_attn_bwd",
    "_dynamo",
    "_indices",
    "_getframe",
)

# Trainer(model, args, data_collator, ...): the collator is the third positional argument
# (transformers 4.x and 5.15-5.25).
POSITIONAL_COLLATOR_INDEX = 2


def attention_registry() -> dict:
    """transformers' name -> attention function mapping (``AttentionInterface._global_mapping``, 5.15-5.25)."""
    from transformers import AttentionInterface

    return AttentionInterface._global_mapping


def attn_implementation(config) -> str | None:
    """The attention implementation a transformers config runs (``config._attn_implementation``, 5.15-5.25)."""
    return getattr(config, "_attn_implementation", None)


def set_attn_implementation(config, name: str) -> None:
    """Set ``config._attn_implementation`` in place (what ``set_attn_implementation`` does, without checks)."""
    config._attn_implementation = name


def trainer_hooks(cls):
    """Class decorator for a ``transformers.Trainer`` subclass: its private hooks, made this package's own.

    ``_run_epoch(..., epoch=...)`` (5.15-5.25) calls ``self._packing_epoch(epoch)`` first;
    ``_set_signature_columns_if_needed`` (5.15-5.25) adds ``cls.packing_columns``;
    ``_get_num_items_in_batch`` (5.15-5.25) asks ``self._packing_items(batch_samples, device)``
    first (``NotImplemented``: the stock count). The MRO stays ``cls -> Trainer``.
    """

    def _run_epoch(self, *args: Any, **kwargs: Any):
        self._packing_epoch(kwargs.get("epoch"))
        return super(cls, self)._run_epoch(*args, **kwargs)

    def _set_signature_columns_if_needed(self) -> None:
        super(cls, self)._set_signature_columns_if_needed()
        columns = list(self._signature_columns)
        self._signature_columns = columns + [c for c in cls.packing_columns if c not in columns]

    def _get_num_items_in_batch(self, batch_samples: list, device):
        items = self._packing_items(batch_samples, device)
        if items is NotImplemented:
            return super(cls, self)._get_num_items_in_batch(batch_samples, device)
        return items

    cls._run_epoch = _run_epoch
    cls._set_signature_columns_if_needed = _set_signature_columns_if_needed
    cls._get_num_items_in_batch = _get_num_items_in_batch
    return cls


def train_batch_size(trainer) -> int:
    """The Trainer's per-device train batch size (``Trainer._train_batch_size``, 5.15-5.25)."""
    return trainer._train_batch_size


def remove_unused_columns(trainer, dataset, description: str):
    """``Trainer._remove_unused_columns`` (5.15-5.25): drop the columns the forward does not name."""
    return trainer._remove_unused_columns(dataset, description=description)


def collator_with_removed_columns(trainer, collator, description: str):
    """``Trainer._get_collator_with_removed_columns`` (5.15-5.25), for a dataset that is not Arrow."""
    return trainer._get_collator_with_removed_columns(collator, description=description)


def prepared_inputs(trainer, batch):
    """``Trainer._prepare_inputs`` (5.15-5.25): a batch on the trainer's device, as its steps see it."""
    return trainer._prepare_inputs(batch)


def trainer_step_inputs(trainer, batch, device):
    """A batch as the Trainer's step sees it and its target count (``_prepare_inputs``,
    ``_get_num_items_in_batch``, 5.15-5.25)."""
    inputs = prepared_inputs(trainer, batch)
    return inputs, trainer._get_num_items_in_batch([inputs], device)


def positional_collator(args: tuple) -> bool:
    """Whether ``Trainer(*args)`` passes ``data_collator`` positionally."""
    return len(args) > POSITIONAL_COLLATOR_INDEX


def base_examples_iterable():
    """``datasets.iterable_dataset._BaseExamplesIterable`` (4.8.4-5.2): the base of a streaming source."""
    from datasets.iterable_dataset import _BaseExamplesIterable

    return _BaseExamplesIterable


def examples_iterable(dataset):
    """A streaming dataset's examples iterable (``IterableDataset._ex_iterable``, 4.8.4-5.2)."""
    return dataset._ex_iterable


def cache_file_path(dataset, fingerprint: str) -> str:
    """Where ``datasets`` caches a transform of ``dataset`` (``Dataset._get_cache_file_path``, 4.8.4-5.2)."""
    return dataset._get_cache_file_path(fingerprint)


def dataset_fingerprint(dataset) -> str | None:
    """``Dataset._fingerprint`` (4.8.4-5.2), or None."""
    return getattr(dataset, "_fingerprint", None)


def set_dataset_fingerprint(dataset, fingerprint: str) -> None:
    """Give a dataset built from a table the fingerprint of its cache file (4.8.4-5.2)."""
    dataset._fingerprint = fingerprint


def dataset_indices(dataset):
    """A select/shuffle/filter view's indices table (``Dataset._indices``, 4.8.4-5.2), or None."""
    return getattr(dataset, "_indices", None)


def format_columns(dataset):
    """The columns ``set_format`` selected (``Dataset._format_columns``, 4.8.4-5.2; else ``format["columns"]``)."""
    return getattr(dataset, "_format_columns", dataset.format["columns"])


def apply_replays(table, replays):
    """``MemoryMappedTable._apply_replays`` (datasets 4.8.4-5.2): a memory-mapped table's recorded ops."""
    from datasets.table import MemoryMappedTable

    return MemoryMappedTable._apply_replays(table, replays)


def fa4_kernels():
    """FA4's ``(forward, backward)`` (``flash_attn.cute.interface._flash_attn_fwd/_bwd``, 4.0.0b36)."""
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    return _flash_attn_fwd, _flash_attn_bwd


def caller_frame(depth: int):
    """The frame ``depth`` calls above the caller (``sys._getframe``, CPython 3.10-3.13)."""
    import sys

    return sys._getframe(depth + 1)


def __getattr__(name: str):
    # BaseExamplesIterable is a base class (needed at class definition): imported from datasets on first use.
    if name == "BaseExamplesIterable":
        return base_examples_iterable()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dynamo_counters():
    """``torch._dynamo.utils.counters`` (2.6-2.13): what Dynamo has compiled so far."""
    from torch._dynamo.utils import counters

    return counters


@functools.lru_cache(maxsize=None)
def dynamo_sources_by_pattern() -> bool:
    """Whether Dynamo matches ``torch.compiler.config.dynamic_sources`` entries as patterns: 2.8-2.13
    (``torch._dynamo.variables.builder.is_dynamic_source``); 2.7 compares whole names, read once; 2.6 has no setting.

    >>> isinstance(dynamo_sources_by_pattern(), bool)
    True
    """
    import torch

    if not hasattr(getattr(torch.compiler, "config", None), "dynamic_sources"):
        return False
    from torch._dynamo.variables import builder

    return callable(getattr(builder, "is_dynamic_source", None))


def raise_recompile_limit(limit: int) -> int:
    """Let Dynamo keep up to ``limit`` graphs of one function (never lowers it); returns the limit now.

    ``torch._dynamo.config.recompile_limit`` (2.7-2.13), ``cache_size_limit`` on 2.6; past it, calls run eager.

    >>> raise_recompile_limit(1) >= 8
    True
    """
    from torch._dynamo import config

    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(limit, getattr(config, name)))
    return getattr(config, name)


def checkpoint_side_effects_not_replayed():
    """A context in which Dynamo traces a checkpointed function whose forward sets a global and puts it back
    (``torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint``, 2.8-2.13; a no-op where absent).

    transformers 5.25's attention layers route their rotary function through ``kernels``' ``use_kernelized_func``,
    whose forward sets a module-level variable and resets it before returning. Inside a checkpoint Dynamo refuses
    that mutation (the recompute would replay it) and the whole layer runs eager; the recompute need not replay it,
    as the value is back to what it was when the forward returns.

    >>> with checkpoint_side_effects_not_replayed():
    ...     pass
    """
    from torch._dynamo import config

    if not hasattr(config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        return contextlib.nullcontext()
    return config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True)


def enable_activation_checkpointing(model, kwargs: dict | None = None) -> None:
    """Turn on transformers' activation checkpointing by its current name: ``activation_checkpointing_enable``
    (5.25; ``gradient_checkpointing_enable``, its deprecated alias there, before).

    >>> import torch
    >>> enable_activation_checkpointing(torch.nn.Linear(2, 2))
    Traceback (most recent call last):
    ...
    TypeError: Linear has no activation checkpointing to enable (a transformers PreTrainedModel has)
    """
    enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
        model, "gradient_checkpointing_enable", None
    )
    if enable is None:
        raise TypeError(
            f"{type(model).__name__} has no activation checkpointing to enable (a transformers PreTrainedModel has)"
        )
    enable(kwargs if kwargs is not None else {"use_reentrant": False})
