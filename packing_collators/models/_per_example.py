"""The exact path for any layer that carries state: run it on the row's examples as one padded batch.

    layer(row (1, T, H))   ->   layer(padded (S, max_length, H))   ->   back to (1, T, H)

Each argument of the call is re-laid by what its name means in transformers' layers, read from the
layer's forward signature (``LayerArguments``; transformers 5.15 to 5.24 use these names)::

    hidden_states, input_states, input_ids,      (B, T, ...) token by token: re-laid like the row
      position_ids, conv_mask, dynamic_input       (Inkling2's per-token convolution taps)
    position_embeddings                          rotary (cos, sin), each (B, T, D): re-laid
    attention_mask                               (B, T) padding: re-laid; (B, 1, T, T): dropped (these
                                                 layers are causal and the padding comes last)
    cache_position                               0 .. max_length - 1 of the padded batch
    cache, cache_params, past_key_values         None: each example starts from nothing
    cu_seq_lens_*, max_length_*, seq_idx         dropped: the padded batch holds one example per row

so the layer's own reference code runs as for an ordinary batch. A tensor laid out (B, T, ...) under
a name not in the table is refused by name, not guessed (a forward whose signature a decorator hid
takes its hidden states first, as every transformers layer does). Needs no kernel package and runs on any
device. Cost: the layer computes ``S * max_length`` tokens instead of ``T`` (``row_segments`` draws
the layout).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from ..batch import PACKING_KEYS
from ._row_segments import RowSegments

__all__ = ["LayerArguments", "run_per_example"]

TOKEN_ARGUMENTS = frozenset(
    {"hidden_states", "input_states", "input_ids", "inputs_embeds", "position_ids", "conv_mask", "dynamic_input"}
)
ROTARY_ARGUMENTS = frozenset({"position_embeddings"})
CACHE_ARGUMENTS = frozenset({"cache", "cache_params", "past_key_values"})


@dataclass(frozen=True)
class LayerArguments:
    """A layer's name and the names of its forward's positional parameters, read once from its signature."""

    layer: str
    positional: tuple[str, ...]

    @classmethod
    def of(cls, name: str, forward) -> LayerArguments:
        """A forward whose decorator hides its parameters behind ``(*args, **kwargs)`` (transformers 5.15's
        ``force_accelerate_hooks`` on Mamba2 mixers) takes its hidden states first, as every layer does."""
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        parameters = inspect.signature(forward).parameters.values()
        positional = tuple(p.name for p in parameters if p.kind in kinds)
        return cls(name, positional or ("hidden_states",))

    def named(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Every argument of a call by its name (a positional one past the named parameters: ``*args[i]``)."""
        names = [*self.positional, *(f"*args[{i}]" for i in range(len(args) - len(self.positional)))]
        return {**dict(zip(names, args)), **kwargs}

    def hidden_states(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The call's hidden states: the first of its token arguments that is a floating-point tensor."""
        for name, value in self.named(args, kwargs).items():
            if name in TOKEN_ARGUMENTS and isinstance(value, torch.Tensor) and value.is_floating_point():
                return value
        return None


class _Relay:
    """Each argument of one call as a group's padded batch takes it (gather sources made once per tensor)."""

    def __init__(self, arguments: LayerArguments, segments: RowSegments) -> None:
        self.arguments, self.segments, self.sources = arguments, segments, {}

    def padded(self, name: str, value: torch.Tensor, group: int) -> torch.Tensor:
        if value.dim() < 2 or tuple(value.shape[:2]) != self.segments.batch_shape:
            raise ValueError(
                f"{self.arguments.layer} got {name} of shape {tuple(value.shape)}, not laid out as the batch "
                f"{self.segments.batch_shape} token by token: the per-example path cannot split it by example."
            )
        if id(value) not in self.sources:  # the call's tensors stay alive while it runs
            self.sources[id(value)] = self.segments.gather_source(value)
        return self.segments.to_padded(value, group, self.sources[id(value)])

    def __call__(self, name: str, value: Any, group: int) -> Any:
        if name in CACHE_ARGUMENTS or value is None:
            return None
        mask = name == "attention_mask" and isinstance(value, torch.Tensor)
        if name in TOKEN_ARGUMENTS or (mask and value.dim() == 2):
            return self.padded(name, value, group)
        if mask:
            return None  # a (B, 1, T, T) mask: the padded batch is causal with its padding last
        if name in ROTARY_ARGUMENTS:
            return tuple(self.padded(f"{name}[{i}]", v, group) for i, v in enumerate(value))
        if name == "cache_position":
            width = self.segments.groups[group].shape[1]
            return torch.arange(width, device=value.device, dtype=value.dtype)
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == self.segments.batch_shape:
            raise ValueError(
                f"{self.arguments.layer}.forward got {name} of shape {tuple(value.shape)}, laid out token by token, "
                "and the per-example path does not know what it means (it knows hidden_states, position_ids, "
                "position_embeddings, attention_mask, ...). Train this model padded, and report the layer."
            )
        return value


def _token_major(value: Any, shape: tuple[int, int]) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == shape


def run_per_example(forward, arguments: LayerArguments, segments: RowSegments, args: tuple, kwargs: dict) -> Any:
    """``forward(*args, **kwargs)`` once per group of the row's examples (each a padded batch), and the
    token-major outputs laid back into the row."""
    kwargs = {k: v for k, v in kwargs.items() if k not in PACKING_KEYS}
    names = list(arguments.named(args, {}))
    relay, outs = _Relay(arguments, segments), []
    for group, gather in enumerate(segments.groups):
        out = forward(
            *(relay(name, a, group) for name, a in zip(names, args)),
            **{k: relay(k, v, group) for k, v in kwargs.items()},
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
