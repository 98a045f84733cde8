"""The static checks on a model before it trains packed: forward signature, cache, rope, attention.

    forward(position_ids, **kwargs)   positions restart per example; cu_seq_lens reach attention
    config.use_cache = False          a cache switches transformers' packed-mask detection off
    no multimodal rope                (3, b, s) positions cannot be flattened
    attention that keeps examples apart, and what packing_varlen/packing_fa4 lack

Cost: signature and config inspection, once before training.
"""

from __future__ import annotations

import inspect
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
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, Mapping) and ("mrope_section" in rope or "mrope_interleaved" in rope):
        raise ValueError(
            f"{name} uses multimodal rope (mrope_section={rope.get('mrope_section')}), whose position_ids are "
            "(3, b, s) and built by the model from image/video grids; flattened batches carry (1, T) positions. "
            "Packing this model is not supported: pad its batches."
        )
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
