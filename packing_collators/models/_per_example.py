"""The exact path for any layer that carries state: run it on the row's examples as one padded batch.

    layer(row (1, T, H))   ->   layer(padded (S, max_length, H))   ->   back to (1, T, H)

Every tensor argument laid out token by token, ``(B, T, ...)`` (the hidden states, ``position_ids``,
rotary ``cos``/``sin``, a 2-D padding mask), is re-laid the same way; a 4-D attention mask is
dropped (these layers are causal by construction and the padding comes last); the packing
keywords (``cu_seq_lens_*``, ``max_length_*``, ``seq_idx``) are dropped, since the padded batch
holds one example per row, so the layer's own reference code runs as for an ordinary batch.
Needs no kernel package and runs on any device. Cost: the layer computes
``S * max_length`` tokens instead of ``T`` (``row_segments`` draws the layout).
"""

from __future__ import annotations

from typing import Any

import torch

from ._row_segments import RowSegments

__all__ = ["PACKING_KEYWORDS", "run_per_example"]

PACKING_KEYWORDS = frozenset({"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"})


def _relaid(value: Any, segments: RowSegments, group: int, sources: dict) -> Any:
    """``value`` as group ``group``'s padded batch takes it (``sources``: each tensor's gather source, made once)."""
    if isinstance(value, torch.Tensor):
        if value.dim() >= 2 and tuple(value.shape[:2]) == segments.batch_shape:
            if id(value) not in sources:
                sources[id(value)] = segments.gather_source(value)
            return segments.to_padded(value, group, sources[id(value)])
        if value.dim() == 4 and value.shape[-1] == segments.batch_shape[1]:
            return None  # a (B, 1, T, T) attention mask: the padded batch is causal with its padding last
        if value.dim() == 1 and value.numel() == segments.batch_shape[1] and not value.is_floating_point():
            width = segments.groups[group].shape[1]  # cache_position
            return torch.arange(width, device=value.device, dtype=value.dtype)
        return value
    if isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(_relaid(v, segments, group, sources) for v in value)  # rotary (cos, sin)
    return value


def _token_major(value: Any, shape: tuple[int, int]) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == shape


def run_per_example(forward, segments: RowSegments, args: tuple, kwargs: dict) -> Any:
    """``forward(*args, **kwargs)`` once per group of the row's examples (each a padded batch), and the
    token-major outputs laid back into the row."""
    kwargs = {k: v for k, v in kwargs.items() if k not in PACKING_KEYWORDS}
    outs, sources = [], {}
    for group, gather in enumerate(segments.groups):
        out = forward(
            *(_relaid(a, segments, group, sources) for a in args),
            **{k: _relaid(v, segments, group, sources) for k, v in kwargs.items()},
        )
        outs.append((out, tuple(gather.shape)))
    first = outs[0][0]
    if isinstance(first, torch.Tensor):
        return segments.from_padded([out for out, _ in outs])
    if isinstance(first, tuple):
        merged = []
        for i, item in enumerate(first):
            if _token_major(item, outs[0][1]):
                merged.append(segments.from_padded([out[i] for out, _ in outs]))
            else:
                merged.append(item)
        return type(first)(merged) if type(first) is tuple else tuple(merged)
    raise TypeError(f"{type(first).__name__} output: the per-example path lays back tensors and tuples of them only.")
