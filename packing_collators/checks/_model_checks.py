"""The static checks on a model before it trains packed: forward signature, cache, rope, attention.

    forward(position_ids, **kwargs)   positions restart per example; cu_seq_lens reach attention
    enable_packing(model)             layers that carry state along the sequence (Gated DeltaNet, Mamba,
                                      short convolutions) and multimodal rope need it to keep examples apart
    config.use_cache = False          a cache switches transformers' packed-mask detection off
    attention that keeps examples apart, and what packing_varlen/packing_fa4 lack

Cost: signature and config inspection, once before training.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Mapping
from typing import Any

from .._compat import attn_implementation
from .._model_unwrap import text_config, unwrap_model
from ..attention import FLASH_IMPLEMENTATIONS, attention_kind, check_backend_limits

__all__ = ["check_model"]


def check_model(model, *, cache_off: bool = False) -> tuple[str, Any]:
    """The model's attention implementation and text config, or a ValueError naming what to change.

    ``cache_off``: every call the model gets says ``use_cache=False`` (the collated batches do), so the
    configs' ``use_cache`` cannot build a cache and is not checked.
    """
    model = unwrap_model(model)
    config = text_config(model)
    params = inspect.signature(model.forward).parameters
    name = type(model).__name__
    _check_prepared(model, config, name)  # first: a stateful model's fix is enable_packing, whatever its forward takes
    if "position_ids" not in params and not _prepared_without_positions(model, params):
        raise ValueError(
            f"{name}.forward takes no position_ids, so a packed batch cannot restart positions per example and "
            "its examples would attend to each other. Pack only models whose forward takes position_ids, or pad."
        )
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise ValueError(
            f"{name}.forward takes no **kwargs, so the batch's cu_seq_lens_q/k and max_length_q/k cannot reach "
            "its attention layers (and the Trainer cannot pass num_items_in_batch for token-weighted loss). "
            "Use a transformers model whose forward accepts **kwargs, or pad."
        )
    if not cache_off:
        _check_cache(model, config, name)
    implementation = attn_implementation(config)
    kind = attention_kind(implementation)
    if kind == "unknown":
        raise ValueError(
            f"{name} uses attn_implementation={implementation!r}, which is not known to honour packed boundaries "
            f"(cu_seq_lens or position_ids). Use one of {', '.join(FLASH_IMPLEMENTATIONS)}, 'packing_varlen' "
            "(register_varlen_attention()), 'flex_attention', 'sdpa' or 'eager'."
        )
    check_backend_limits(config, implementation, name)  # packing_varlen, packing_fa4: what their kernels lack
    return implementation, config


def _prepared_without_positions(model, params) -> bool:
    """A model whose sequence mixing enable_packing prepared and that takes no position_ids (a state-space model
    such as Mamba): its prepared layers read the boundaries from the batch's cu_seq_lens, which reach them through
    ``**kwargs``; the live probe measures that they do (measured exact on the CPU: the architecture sweep)."""
    from ..models import packing_layers  # torch, on first use

    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return takes_kwargs and packing_layers(model) is not None


def _check_prepared(model, config, name: str) -> None:
    """Refuse a model whose layers carry state along the sequence, or whose rotary positions come from image
    grids, unless ``enable_packing`` prepared it; and a multimodal rope no module of the model computes."""
    from ..models import find_stateful_layers, multimodal_model, packing_layers  # torch, on first use

    if packing_layers(model) is None:
        stateful = Counter(type(layer).__name__ for _, layer in find_stateful_layers(model))
        if stateful:
            kinds = ", ".join(f"{kind} x{count}" for kind, count in stateful.items())
            raise ValueError(
                f"{name} has layers that carry state along the sequence ({kinds}): in a packed row each example "
                "would start from the state the examples before it left. Call packing_collators.enable_packing(model) "
                "before training (PackingTrainer does): it runs them per example, or on flash-linear-attention's "
                "varlen kernels."
            )
        if multimodal_model(model) is not None:
            raise ValueError(
                f"{name} numbers positions from image and video grids (multimodal rope, get_rope_index), over the "
                "whole row: a packed row would number each example on from the one before. Call "
                "packing_collators.enable_packing(model) before training (PackingTrainer does): it computes each "
                "example's positions on its own."
            )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, Mapping) and "mrope_section" in rope and multimodal_model(model) is None:
        if hasattr(getattr(model, "config", None), "vision_config"):
            raise ValueError(
                f"{name} uses multimodal rope (mrope_section={rope.get('mrope_section')}) but has no get_rope_index "
                "this library can call per example, so a packed row's image positions cannot be made right. "
                "Pad its batches."
            )


def _cache_flags(model, config) -> list[str]:
    """The ``use_cache`` flags that are on where the forward reads them, as a user writes them: the model's
    config, and a composite config's text config, which its language model reads on its own (a flat
    checkpoint config such as Qwen2.5-VL's puts ``use_cache: true`` there, and ``model.config.use_cache``
    does not reach it)."""
    top = model.config
    flags = ["model.config.use_cache"] if getattr(top, "use_cache", False) else []
    if config is not top and getattr(config, "use_cache", False):
        names = [n for n in getattr(type(top), "sub_configs", {}) or {} if getattr(top, n, None) is config]
        flags.append(f"model.config.{names[0]}.use_cache" if names else "model.config.get_text_config().use_cache")
    return flags


def _check_cache(model, config, name: str) -> None:
    flags = _cache_flags(model, config)
    if not flags:
        return
    reach = (
        " (the language model reads its own config: model.config.use_cache does not reach it)"
        if "model.config.use_cache" not in flags
        else ""
    )
    raise ValueError(
        f"{name}: {' and '.join(flags)} {'is' if len(flags) == 1 else 'are'} True{reach}. During training that "
        "builds a KV cache, and with a cache transformers stops detecting packed sequences (sdpa/eager/flex then let "
        f"examples attend to each other). Set {' and '.join(f + ' = False' for f in flags)} before training "
        "(generation can turn it back on), or give the model batches that say use_cache=False (FlatteningCollator "
        "and PrePackedCollator put it in every batch: pass the batch, or the collator, to this check)."
    )
