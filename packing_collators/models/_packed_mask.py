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
masks are left as they are. The layer's forward is a ``PackedMaskForward`` that holds the layer and
reads the examples from the call's scope (``_scope.py``); the packed masks live in that scope, so
the layers given the same mask share one, and they go when the call (and its recomputes) ends.
Cost: one (B, T, T) comparison per forward, shared by the layers.
"""

from __future__ import annotations

import inspect

import torch

from .._compat import attn_implementation
from ._scope import ForwardScope, LayerForward, PackingRuntime

__all__ = ["PackedMaskForward", "is_causal_attention", "keys_layout_mask", "packed_mask"]


def is_causal_attention(module) -> bool:
    """A causal attention module of transformers: ``is_causal`` set and an ``attention_mask`` argument."""
    if not getattr(module, "is_causal", False):
        return False
    return "attention_mask" in inspect.signature(module.forward).parameters


def _same_example(scope: ForwardScope) -> torch.Tensor:
    """bool (B, 1, T, T): query and key tokens of the same example, causal (made once per call)."""
    if scope.same_example is None and scope.kv_index is not None:
        scope.same_example = keys_layout_mask(scope.kv_index, scope.q_index, scope.segments.cu_seq_lens)
    if scope.same_example is None:
        ids = scope.segments.seq_idx()
        scope.same_example = torch.tril(ids[:, :, None] == ids[:, None, :])[:, None]
    return scope.same_example


def keys_layout_mask(kv_index: torch.Tensor, q_index: torch.Tensor, cu_keys: torch.Tensor) -> torch.Tensor:
    """bool (1, 1, T, T): which row tokens each row token may attend to when the keys are laid out apart
    (``kv_index``: each key's row token; ``q_index``: each row token's key; ``cu_keys``: the keys' examples).

    A query at key position ``q_index[i]`` sees the keys of its own example up to itself, folded back
    onto the row tokens they are. A shared prompt ``[P C R]`` with keys ``[P C | P R]``:

    >>> keys_layout_mask(torch.tensor([0, 1, 2, 0, 1, 3]), torch.tensor([0, 1, 2, 5]), torch.tensor([0, 3, 6]))[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
    """
    device = kv_index.device
    keys = torch.arange(kv_index.numel(), device=device)
    example = torch.searchsorted(cu_keys[1:].to(device=device, dtype=torch.int64), keys, right=True)
    query = q_index.to(device)
    visible = (example[None, :] == example[query][:, None]) & (keys[None, :] <= query[:, None])  # (T, keys)
    rows = torch.zeros(query.numel(), query.numel(), dtype=torch.float32, device=device)
    rows.index_add_(1, kv_index, visible.float())
    return (rows > 0)[None, None]


def packed_mask(scope: ForwardScope, mask, implementation: str, dtype: torch.dtype):
    """``mask`` (the model's, or None) restricted to the examples of ``scope.segments``; made once per call
    and mask (the scope keeps the model's mask with it, so the layers that get the same one share it)."""
    for original, made_for, made_dtype, packed in scope.masks:
        if original is mask and made_for == implementation and made_dtype == dtype:
            return packed
    same = _same_example(scope)
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
    scope.masks.append((mask, implementation, dtype, packed))
    return packed


class PackedMaskForward(LayerForward):
    """A causal attention layer's forward with its ``attention_mask`` restricted to the examples of the call's
    scope (sdpa/eager); under other implementations, or with nothing packed, the layer's own."""

    def __init__(self, layer, runtime: PackingRuntime, config) -> None:
        super().__init__(layer, runtime)
        self.config = config  # the layer's, else the model's text config: its attention implementation
        self.signature = inspect.signature(self.original_forward())

    def __call__(self, *args, **kwargs):
        scope = self.runtime.scope
        implementation = attn_implementation(self.config)
        if scope is None or scope.segments is None or implementation not in ("sdpa", "eager"):
            return self.call_original(*args, **kwargs)
        call = self.signature.bind(*args, **kwargs)  # the mask by position or name
        hidden = args[0] if args else kwargs.get("hidden_states")
        mask = call.arguments.get("attention_mask")
        call.arguments["attention_mask"] = packed_mask(scope, mask, implementation, hidden.dtype)
        return self.call_original(*call.args, **call.kwargs)
