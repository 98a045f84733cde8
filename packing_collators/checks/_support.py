"""Refuse, before training, the set-ups in which a packed batch would silently mix its examples.

A flattened row ``[S1 S1 S1 S2 S2 S3 S3 S3]`` is only correct if every attention
layer keeps ``S1``, ``S2`` and ``S3`` apart. What keeps them apart depends on the
attention implementation:

    flash_attention_2/3/4, packing_varlen   cu_seq_lens_q/k from the batch
    sdpa, eager, flex_attention             transformers' packed-sequence mask, rebuilt from
                                            position_ids, and only when there is neither an
                                            attention_mask nor a KV cache

and layers that carry state along the sequence (Gated DeltaNet, Mamba, short
convolutions) or number positions from image grids need ``enable_packing(model)``. Each
rule below was a silent wrong loss in practice, e.g. ``config.use_cache=True``
(the default of most checkpoints) makes transformers build a cache during
training, which switches the packed-sequence mask off for sdpa/eager/flex.
Cost: signature and config inspection plus, when a batch is given, a few numpy
ops over its ``position_ids``; run once before training, not per step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .._model_unwrap import probe_module
from ..attention import attention_kind
from ._batch_checks import check_batch
from ._model_checks import check_model
from ._probe import probe_packing
from ._probe_refusal import refuse_failed_probe

__all__ = ["check_packing_support"]

logger = logging.getLogger(__name__)


def check_packing_support(
    model, batch: Mapping[str, Any] | None = None, *, collator=None, probe: bool = True, autocast=None
) -> str:
    """Raise a ValueError saying what to change if ``model`` (and ``batch``) cannot train packed safely.

    Static checks first (fast, with the clearest messages): no PEFT prompt or prefix tuning (its virtual
    tokens come once per packed row), the model's forward takes
    ``position_ids`` and ``**kwargs``, a model with stateful layers (hybrids) or multimodal
    rope was prepared by :func:`enable_packing`, ``use_cache`` is off where the forward reads it
    (the model's config, and a vision-language model's text config) unless ``batch`` says
    ``use_cache=False`` (or, with no batch, ``collator`` puts that in every batch, as this library's
    collators do), the kernel limits of ``packing_varlen``; and, when a collated ``batch`` is given, every row of it: no
    ``attention_mask`` beside a packed layout, ``position_ids`` that restart where
    ``cu_seq_lens`` says, no multi-row packed batch under flash attention (which needs one
    row). Then, with ``probe=True`` (default), the live
    equivalence probe (:func:`probe_packing`): synthetic examples collated by ``collator``
    (default :class:`FlatteningCollator`), run packed and alone on the model as it is
    (attention implementation, dtype, device); a model whose packed outputs differ, or
    whose examples see each other, is refused with the measured numbers. ``autocast``
    is a context manager for the probe's forwards (the Trainer's mixed precision).
    Returns the attention implementation.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    >>> model = LlamaForCausalLM(config)
    >>> check_packing_support(model)
    Traceback (most recent call last):
    ...
    ValueError: LlamaForCausalLM: model.config.use_cache is True. During training that builds a KV cache, and with a cache transformers stops detecting packed sequences (sdpa/eager/flex then let examples attend to each other). Set model.config.use_cache = False before training (generation can turn it back on), or give the model batches that say use_cache=False (FlatteningCollator and PrePackedCollator put it in every batch: pass the batch, or the collator, to this check).
    >>> from packing_collators import FlatteningCollator
    >>> check_packing_support(model, FlatteningCollator()([{"input_ids": [3, 4, 5]}, {"input_ids": [6, 7]}]))
    'sdpa'
    >>> model.config.use_cache = False
    >>> check_packing_support(model)
    'sdpa'
    """
    from ..models import refuse_prompt_learning  # torch, on first use

    refuse_prompt_learning(model)  # PEFT prompt / prefix tuning: virtual tokens once per row, not per example
    implementation, config = check_model(model, cache_off=_cache_turned_off(batch, collator))
    if batch is not None:
        check_batch(batch, implementation, config)
    if probe:
        report = probe_packing(probe_module(model), collator, autocast=autocast)
        logger.info("%s", report.summary())
        refuse_failed_probe(report, attention_kind(implementation))
    return implementation


def _cache_turned_off(batch: Mapping[str, Any] | None, collator) -> bool:
    """Whether the model's training calls say ``use_cache=False``: the given batch does, or (no batch) the
    collator puts it in every batch (``disable_cache``, the default of this library's collators)."""
    if batch is not None:
        value = batch.get("use_cache")
        return value is not None and not bool(value)
    inner = getattr(collator, "data_collator", collator)  # transformers' RemoveColumnsCollator wraps it
    return getattr(getattr(inner, "options", None), "disable_cache", False) is True
