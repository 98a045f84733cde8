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

__all__ = ["AUTO_ATTENTION", "choose_attention", "packed_attention_candidates"]

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
