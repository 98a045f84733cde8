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


def check_model(model) -> tuple[str, Any]:
    model = unwrap_model(model)
    config = text_config(model)
    params = inspect.signature(model.forward).parameters
    name = type(model).__name__
    if "position_ids" not in params:
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
    _check_prepared(model, config, name)
    if getattr(config, "use_cache", False):
        raise ValueError(
            f"{name}: model.config.use_cache is True. During training that builds a KV cache, and with a cache "
            "transformers stops detecting packed sequences (sdpa/eager/flex then let examples attend to each other). "
            "Set model.config.use_cache = False before training (generation can turn it back on)."
        )
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
