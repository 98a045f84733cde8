"""Choosing the fastest attention implementation that keeps packed examples apart, on this machine.

In order of speed on packed batches (measured in docs/benchmarks.md)::

    packing_fa4         FA4's kernel called straight from the batch (this library's backend): what
                        flash_attention_4 runs, less host work per layer; taken only where
                        transformers accepts flash_attention_4
    flash_attention_4   Hopper (sm90) / Blackwell (sm100+), flash-attn-4 installed (flash_attn.cute)
    flash_attention_3   Hopper, flash-attn 3 installed (flash_attn_interface)
    flash_attention_2   Ampere or newer, flash-attn 2 installed
    packing_varlen      any CUDA GPU with PyTorch >= 2.10 (torch.nn.attention.varlen), nothing to install
    (the model's own)   sdpa / eager / flex_attention: packed through position_ids, the CPU choice

A candidate is taken only if transformers accepts it for the model (``set_attn_implementation``
validates the install and the GPU) and the model needs nothing the backend lacks
(:func:`check_backend_limits`: ``packing_varlen`` has no logit softcapping, neither backend has
attention dropout). The packing checks and the live probe then test the choice before training
begins. Cost: a few imports and one attribute change, once.
"""

from __future__ import annotations

import importlib.util
import logging

from .._compat import attn_implementation
from .._model_unwrap import text_config, unwrap_model
from ._fa4 import FA4_ATTENTION, register_fa4_attention
from ._kind import check_backend_limits
from ._varlen import VARLEN_ATTENTION, register_varlen_attention

__all__ = ["AUTO_ATTENTION", "choose_attention", "packed_attention_candidates", "warm_up_attention"]

logger = logging.getLogger(__name__)

AUTO_ATTENTION = "auto"


def packed_attention_candidates(device=None) -> list[str]:
    """The packed-correct implementations this machine may run, fastest first (none on a CPU).

    >>> import torch
    >>> packed_attention_candidates(torch.device("cpu"))
    []
    """
    import torch

    device = torch.device("cuda") if device is None and torch.cuda.is_available() else device
    if device is None or torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return []
    major, _ = torch.cuda.get_device_capability(device)
    candidates = []
    if major >= 9 and importlib.util.find_spec("flash_attn") and _has_module("flash_attn.cute"):
        candidates += [register_fa4_attention(), "flash_attention_4"]
    if major == 9 and importlib.util.find_spec("flash_attn_interface"):
        candidates.append("flash_attention_3")
    if major >= 8 and importlib.util.find_spec("flash_attn") and _has_module("flash_attn.flash_attn_interface"):
        candidates.append("flash_attention_2")
    if hasattr(getattr(torch.nn.attention, "varlen", None), "varlen_attn") or _has_module("torch.nn.attention.varlen"):
        candidates.append(register_varlen_attention())
    return candidates


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _register_own(name: str) -> None:
    """Register this library's backends by name, so that asking for one by name just works."""
    if name == VARLEN_ATTENTION:
        register_varlen_attention()
    elif name == FA4_ATTENTION:
        register_fa4_attention()


def choose_attention(model, requested: str | None = AUTO_ATTENTION) -> str:
    """Set ``model``'s attention implementation for packed training and return it.

    ``requested``: ``"auto"`` (the fastest packed-correct one available, else the model's
    own), ``None`` (keep the model's), or a name (set exactly that one, registering this
    library's ``packing_varlen`` / ``packing_fa4`` first; transformers raises if it cannot run here).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from packing_collators import choose_attention
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
    ...                                      num_attention_heads=2, intermediate_size=8, use_cache=False))
    >>> choose_attention(model)  # on a CPU nothing beats the model's own
    'sdpa'
    """
    model = unwrap_model(model)
    current = attn_implementation(text_config(model))
    if requested is None:
        return current

    def set_to(name: str) -> None:  # transformers may only warn where a model cannot switch: check it did
        model.set_attn_implementation(name)
        now = attn_implementation(text_config(model))
        if now != name:
            raise ValueError(
                f"{type(model).__name__} did not switch to attn_implementation={name!r} (it has {now!r}; "
                "transformers logs why). Load the model with that attn_implementation instead."
            )

    if requested != AUTO_ATTENTION:
        _register_own(requested)
        set_to(requested)
        return requested
    parameter = next(model.parameters(), None)
    for candidate in packed_attention_candidates(parameter.device if parameter is not None else None):
        if candidate == current:
            return current
        try:
            if candidate == FA4_ATTENTION:  # transformers validates FA4's install and GPU for its own name
                model.set_attn_implementation("flash_attention_4")
            set_to(candidate)
            check_backend_limits(text_config(model), candidate, type(model).__name__)
        except (ImportError, ValueError) as error:
            logger.info("attention %s not taken: %s", candidate, str(error).splitlines()[0][:200])
            model.set_attn_implementation(current)
            continue
        logger.warning(
            "packing_collators: attention %s (the fastest packed-correct one here; the model had %s). "
            "Pass attn_implementation=None to keep the model's.",
            candidate,
            current,
        )
        return candidate
    return current


FA4_MANY = 256
"""FA4 schedules a batch of more than this many sequences with a batch-lookup aid, a kernel variant of its own
(flash_attn.cute's ``BIN_BATCH_SEARCH_THRESH``)."""

MANY_SEQUENCES = 300
"""Sequences in a warm-up batch that must count as "many" (more than ``FA4_MANY``)."""


def warm_up_lengths(max_length: int, shortest: int = 1) -> list[int]:
    """The longest-example lengths a warm-up runs: both ends of every octave from 16 up to ``max_length``,
    but for the octaves below ``shortest`` (the shortest example: no batch's longest sequence is shorter).

    A JIT kernel's variant follows thresholds on the batch's longest example (FA4's backward
    specializes on whether the queries or keys fit one tile of 64 or 128; its forward on whether
    the grouped-query-packed queries fit one block): lengths ``2**j`` and ``2**j + 1`` fall on both
    sides of every power-of-two threshold, and each octave holds both ends, so a threshold inside
    one (a tile over 3 query heads) also has a length on each side.

    >>> warm_up_lengths(300)
    [16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 300]
    >>> warm_up_lengths(300, shortest=100)  # (64, 128] holds 100: its two ends, and the octaves above
    [65, 128, 129, 256, 257, 300]
    >>> warm_up_lengths(10)
    [10]
    """
    lengths, power = [min(16, max_length)], 16
    while power < max_length:
        lengths += [n for n in (power + 1, 2 * power) if n <= max_length]
        power *= 2

    def octave_top(n: int) -> int:  # the longest length whose variants n stands for
        return min(max_length, max(16, 1 << (n - 1).bit_length()))

    return [n for n in sorted(set(lengths) | {max_length}) if octave_top(n) >= min(shortest, max_length)]


def _backward_through_layers(model, batch: dict, autocast=None) -> None:
    """A forward (under ``autocast``) and backward through every layer without the ``T x V`` logits: only the
    last position's logits where the model takes ``logits_to_keep`` (every layer's backward kernels still run
    over all ``T`` tokens), else the model's own loss."""
    import contextlib
    import inspect

    with autocast or contextlib.nullcontext():
        if "logits_to_keep" in inspect.signature(type(unwrap_model(model)).forward).parameters:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            loss = model(**inputs, logits_to_keep=1).logits.float().sum()
        else:
            loss = model(**batch).loss
    loss.backward()


def warm_up_attention(
    model, *, max_length: int, tokens: int = 4096, autocast=None, shortest: int = 1, most_sequences: int | None = None
) -> float:
    """Run forward and backward on flat batches whose longest example grows from 16 to ``max_length`` tokens.

    JIT-compiled kernels (FlashAttention-4) compile one variant per configuration, and the
    configuration follows the batch: its ``max_length_q`` (FA4 packs grouped-query heads for
    short sequences; its backward has a variant for queries or keys that fit one tile) and its
    number of sequences (more than 256 get another scheduler): left alone, a run compiles
    kernels whenever a batch of a new kind arrives, seconds at a time in the middle of training. So each
    length of :func:`warm_up_lengths` is run twice: as ``tokens`` tokens of examples of that
    length, and as one example of that length among ``MANY_SEQUENCES`` 8-token ones. The backward
    starts from the last position's logits (not a loss over ``T x V`` logits: a 16,384-token row at a
    152k vocabulary would hold 25 GB more than training does). The forwards run under ``autocast`` (the
    Trainer's: float32 weights with ``bf16=True`` give the kernel the half activations training does; a
    kernel refuses float32). Gradients are cleared after; no weight changes. Returns the seconds it took.

    What training can reach, where the caller knows it: ``shortest``, the shortest example (the octaves
    below it are left out); ``most_sequences``, the most sequences a batch can hold (at most ``FA4_MANY``:
    the many-sequence batches are left out). Each leaves out kernels no training batch would select.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from packing_collators import choose_attention
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
    ...                                      num_attention_heads=2, intermediate_size=8, use_cache=False))
    >>> warm_up_attention(model, max_length=64, tokens=128) >= 0
    True
    """
    import time

    import torch

    from ..collate import FlatteningCollator

    started = time.perf_counter()
    parameter = next(model.parameters())
    vocab = int(text_config(model).vocab_size)
    generator = torch.Generator().manual_seed(0)

    def run(lengths: list[int]) -> None:
        examples = [{"input_ids": torch.randint(0, vocab, (n,), generator=generator)} for n in lengths]
        batch = {
            k: v.to(parameter.device) if hasattr(v, "to") else v for k, v in FlatteningCollator()(examples).items()
        }
        _backward_through_layers(model, batch, autocast)

    many = most_sequences is None or most_sequences > FA4_MANY
    for length in warm_up_lengths(max_length, shortest):
        run([length] * max(1, min(tokens, max_length * 4, FA4_MANY * length) // length))
        if many:
            run([length] + [min(8, length)] * MANY_SEQUENCES)
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started
