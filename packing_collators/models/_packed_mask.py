"""The attention mask of a packed batch: the model's own mask, and nothing across examples.

    row           a b c | d e | f g h i
    model's mask  causal (and its sliding window, if any), over the whole row
    packed mask   the model's mask AND "same example":   a    d    f
                                                          ab   de   fg ...

transformers builds the packed mask itself when the model hands ``position_ids`` to its mask
builder; a model that does not (Granite-4.0-H's ``GraniteMoeHybridModel`` builds its causal mask
without them) lets each example see the ones before it under sdpa/eager. In a model that
``enable_packing`` prepares, every causal attention layer's mask is intersected with the batch's
examples: a tensor mask is masked where two tokens belong to different examples, and no mask
(sdpa's plain causal case) becomes the causal mask of each example. A mask that is already packed
is unchanged by it; kernels that read ``cu_seq_lens`` (flash, ``packing_varlen``) and flex's block
masks are left as they are. Cost: one (B, T, T) comparison per forward, shared by the layers.
"""

from __future__ import annotations

import inspect

import torch

from .._compat import attn_implementation

__all__ = ["is_causal_attention", "packed_mask", "packed_mask_forward"]


def is_causal_attention(module) -> bool:
    """A causal attention module of transformers: ``is_causal`` set and an ``attention_mask`` argument."""
    if not getattr(module, "is_causal", False):
        return False
    return "attention_mask" in inspect.signature(module.forward).parameters


def _same_example(state) -> torch.Tensor:
    """bool (B, 1, T, T): query and key tokens of the same example, causal."""
    if "same" not in state.masks:
        ids = state.segments.seq_idx()
        same = ids[:, :, None] == ids[:, None, :]
        state.masks["same"] = torch.tril(same)[:, None]
    return state.masks["same"]


def packed_mask(state, mask, implementation: str, dtype: torch.dtype):
    """``mask`` (the model's, or None) restricted to the examples of ``state.segments``."""
    segments = state.segments
    if state.masks.get("segments") is not segments:
        state.masks.clear()  # one batch at a time: the previous batch's masks go
        state.masks["segments"] = segments
    key = (id(mask), implementation, dtype)
    if key in state.masks:
        return state.masks[key][1]
    same = _same_example(state)
    if mask is None:
        packed = same if implementation == "sdpa" else torch.zeros(same.shape, dtype=dtype, device=same.device)
        if implementation != "sdpa":
            packed.masked_fill_(~same, torch.finfo(dtype).min)
    elif not isinstance(mask, torch.Tensor) or mask.dim() != 4 or mask.shape[-2:] != same.shape[-2:]:
        packed = mask  # a flex BlockMask, or a shape this does not know: the probe measures it
    elif mask.dtype == torch.bool:
        packed = mask & same
    else:
        packed = mask.masked_fill(~same, torch.finfo(mask.dtype).min)
    state.masks[key] = (mask, packed)  # the model's mask is kept alive with its key
    return packed


def packed_mask_forward(module, original, state, config):
    """``module``'s forward with its ``attention_mask`` restricted to the packed batch's examples (sdpa/eager)."""
    signature = inspect.signature(original)

    def forward(*args, **kwargs):
        implementation = attn_implementation(config)
        if state.segments is None or implementation not in ("sdpa", "eager"):
            return original(*args, **kwargs)
        call = signature.bind(*args, **kwargs)  # the mask may come by position or by name
        hidden = args[0] if args else kwargs.get("hidden_states")
        mask = call.arguments.get("attention_mask")
        call.arguments["attention_mask"] = packed_mask(state, mask, implementation, hidden.dtype)
        return original(*call.args, **call.kwargs)

    forward.__packing_original__ = original
    return forward
