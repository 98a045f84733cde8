"""enable_packing(model): every layer of the model keeps the packed examples of a batch apart.

    model(input_ids (1, T), position_ids, cu_seq_lens_q, ...)
      pre-hook: the batch's examples (RowSegments), read once per forward
        Gated DeltaNet layer   -> flash-linear-attention's varlen kernels, on CUDA     (fast)
        any other stateful layer, or no kernels here -> the layer per example, padded  (exact anywhere)
        attention              -> as before: cu_seq_lens (flash, packing_varlen) or the packed mask

The boundaries are read by a forward pre-hook on the model from what the collators already emit
(``cu_seq_lens_q``, else restarting ``position_ids``), and kept until the next forward. Gradient
checkpointing recomputes a layer during the backward, after the forward has returned: each
checkpointed layer carries the boundaries of its own forward into its recompute (reentrant or not),
so a second forward before the backward cannot change them. A layer called with another batch's
shape is refused. A call that passes a cache (``generate``) is not packed: the cache carries one
sequence's state from call to call, and left padding restarts the positions without starting examples.
Cost: one read of the boundaries per forward; each stateful layer then runs as its path says.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ._gated_deltanet import fla_kernels, gated_deltanet_layout, gated_deltanet_varlen_forward
from ._mixers import find_stateful_layers
from ._multimodal import MultimodalPositions, multimodal_model
from ._packed_mask import is_causal_attention, packed_mask_forward
from ._per_example import PACKING_KEYWORDS, run_per_example
from ._row_segments import RowSegments, row_segments

__all__ = ["PackingLayers", "enable_packing", "packing_layers", "prepare_model"]

logger = logging.getLogger(__name__)

_STATE = "_packing_collators_state"
_CACHE_KEYWORDS = ("cache", "past_key_values", "cache_params")
_CARRIES = "__packing_carries_segments__"
PER_EXAMPLE = "per example (the layer run on the row's examples as one padded batch; exact, no kernel needed)"


@dataclass
class PackingLayers:
    """What ``enable_packing`` did to a model: each stateful layer kind and the path it takes.

    Attributes:
        paths: ``{layer class: path}``; ``counts``: ``{layer class: how many}``.
        stateful: the classes of the layers that carry state along the sequence.
        multimodal: the class that numbers multimodal positions per example, or None.
        segments: the examples of the last batch the model was called with (None: not packed).
        generating: whether that call passed a cache (``generate``): nothing in it is packed.
    """

    paths: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    stateful: tuple[str, ...] = ()
    multimodal: str | None = None
    segments: RowSegments | None = None
    source: Any = None
    version: int | None = None
    generating: bool = False
    masks: dict = field(default_factory=dict)
    checkpointed: tuple = ()

    def summary(self) -> str:
        if not self.paths:
            return "no layer carries state along the sequence; attention keeps the examples apart"
        return "; ".join(f"{name} x{self.counts[name]}: {path}" for name, path in self.paths.items())


def packing_layers(model) -> PackingLayers | None:
    """What ``enable_packing`` did to ``model`` (or the model inside it), None if it was not called."""
    from .._model_unwrap import unwrap_model

    return getattr(unwrap_model(model), _STATE, None)


def _hidden_states(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() == 3 and value.is_floating_point():
            return value
    return None


def _batch_shape(module, args: tuple, kwargs: dict) -> tuple[int, int] | None:
    for key in ("input_ids", "inputs_embeds"):
        if isinstance(kwargs.get(key), torch.Tensor):
            return tuple(kwargs[key].shape[:2])
    if args and isinstance(args[0], torch.Tensor):
        return tuple(args[0].shape[:2])
    return None


def _read_boundaries(state: PackingLayers):
    """The forward pre-hook: the batch's examples, from cu_seq_lens_q or position_ids."""

    def hook(module, args, kwargs):
        shape = _batch_shape(module, args, kwargs)
        if shape is None:
            return None
        state.generating = _passes_cache(kwargs)
        if state.generating:  # generate(): one sequence per row, its state carried by the cache
            state.source = state.segments = None
            return None
        positions = kwargs.get("position_ids")
        if positions is None and args:  # (input_ids, attention_mask, position_ids, ...) given positionally
            positions = inspect.signature(module.forward).bind_partial(*args).arguments.get("position_ids")
        cu = kwargs.get("cu_seq_lens_q")
        source = cu if cu is not None else positions
        version = getattr(source, "_version", None)  # a buffer refilled in place is another batch
        if source is not None and source is state.source and version == state.version and state.segments is not None:
            return None  # the inner model of the same call: already read
        state.source, state.version = source, version
        state.segments = row_segments(shape, cu_seq_lens=cu, position_ids=positions)
        if module.training and state.checkpointed:
            _carry_into_recomputes(state)
        return None

    return hook


def _passes_cache(kwargs: dict) -> bool:
    """Whether a call hands the model a cache (``generate``): the call continues one sequence per row."""
    return any(kwargs.get(key) is not None for key in _CACHE_KEYWORDS)


def _carry_into_recomputes(state: PackingLayers) -> None:
    """Wrap each checkpointed layer's checkpoint function (set by ``gradient_checkpointing_enable``, before or
    after ``enable_packing``) so that the layer's recompute in the backward runs with its forward's boundaries."""
    for layer in state.checkpointed:
        func = getattr(layer, "_gradient_checkpointing_func", None)
        if getattr(layer, "gradient_checkpointing", False) and func is not None and not hasattr(func, _CARRIES):
            layer._gradient_checkpointing_func = _carrying(func, state)


def _carrying(checkpoint, state: PackingLayers):
    def checkpointed(function, *args, **kwargs):
        segments = state.segments  # this forward's; the recompute calls ``run`` again, later

        def run(*inner_args, **inner_kwargs):
            saved = state.segments
            state.segments = segments
            try:
                return function(*inner_args, **inner_kwargs)
            finally:
                state.segments = saved

        return checkpoint(run, *args, **kwargs)

    setattr(checkpointed, _CARRIES, True)
    return checkpointed


def _check_call(name: str, segments: RowSegments, hidden: torch.Tensor | None, kwargs: dict) -> None:
    if hidden is None or tuple(hidden.shape[:2]) != segments.batch_shape:
        got = None if hidden is None else tuple(hidden.shape)
        raise RuntimeError(
            f"{name} was called with hidden states {got} while the model's last batch was {segments.batch_shape}: "
            "its examples' boundaries are unknown. Call the model itself (its forward reads the boundaries), "
            "one packed batch at a time."
        )
    if any(_holds_tokens(kwargs.get(key)) for key in _CACHE_KEYWORDS):
        raise ValueError(
            f"{name} got a cache that already holds tokens with a packed batch; a cache carries state from one call "
            "to the next, across the examples. Train packed with use_cache=False (model.config.use_cache = False)."
        )


def _holds_tokens(cache) -> bool:
    """Whether a cache carries earlier tokens in (an empty one, made because use_cache is on, is dropped)."""
    if cache is None:
        return False
    try:
        return int(cache.get_seq_length()) > 0
    except Exception:  # noqa: BLE001 - a cache type without get_seq_length: assume it holds state
        return True


def _unpacked(name: str, kwargs: dict) -> dict:
    """``kwargs`` without cu_seq_lens_* / max_length_* / seq_idx, which only say "one example" here
    (transformers' reference kernels refuse them even then); several examples would be a bug."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None and cu.numel() > 2:
        raise RuntimeError(
            f"{name} got cu_seq_lens_q of {cu.numel() - 1} examples, but the model's forward did not read them "
            "(its boundaries pre-hook did not run). Call the model itself with the packed batch."
        )
    return {k: v for k, v in kwargs.items() if k not in PACKING_KEYWORDS}


def _stateful_forward(layer, original, state: PackingLayers, kernels, layout: str | None):
    name = type(layer).__name__

    def forward(*args, **kwargs):
        segments = state.segments
        if segments is None:  # one example per row: the layer's own code, without the packing keywords
            return original(*args, **_unpacked(name, kwargs))
        hidden = _hidden_states(args, kwargs)
        _check_call(name, segments, hidden, kwargs)
        kwargs = {k: None if k in _CACHE_KEYWORDS else v for k, v in kwargs.items()}  # an empty cache: not kept
        if layout is not None and kernels is not None and hidden.device.type == kernels.device_type:
            flat = hidden.reshape(1, -1, hidden.shape[-1])
            out = gated_deltanet_varlen_forward(layer, flat, segments.cu_seqlens, kernels, layout)
            return out.reshape(hidden.shape[:2] + out.shape[2:])
        return run_per_example(original, segments, args, kwargs)

    forward.__packing_original__ = original
    return forward


def _path(layer, kernels, why_not: str) -> tuple[str, str | None]:
    layout = gated_deltanet_layout(layer)
    if layout is None:
        return PER_EXAMPLE, None
    if kernels is None:
        return f"{PER_EXAMPLE}; the varlen kernels are not used: {why_not}", layout
    where = "CUDA" if kernels.device_type == "cuda" else kernels.device_type
    return f"{kernels.name} varlen kernels on {where} ({layout} projections), {PER_EXAMPLE} elsewhere", layout


def _rebuild_attention_masks(model, state: PackingLayers, stateful: set[int]) -> None:
    """Causal attention layers get the packed batch's mask under sdpa/eager/flex (see _packed_mask)."""
    from .._model_unwrap import text_config

    config = text_config(model)
    count = 0
    for module in model.modules():
        if id(module) not in stateful and is_causal_attention(module):
            module.forward = packed_mask_forward(module, module.forward, state, getattr(module, "config", config))
            count += 1
    if count:
        state.paths["attention"] = (
            "cu_seq_lens under flash / packing_varlen; under sdpa and eager the model's mask with nothing "
            "across examples"
        )
        state.counts["attention"] = count


def _install_hooks(model, state: PackingLayers) -> None:
    hook = _read_boundaries(state)
    owners = {id(model): model}
    base = getattr(model, "base_model", None) if hasattr(model, "base_model_prefix") else None
    if isinstance(base, torch.nn.Module) and base is not model:
        owners[id(base)] = base
    for module in owners.values():
        module.register_forward_pre_hook(hook, with_kwargs=True)


def enable_packing(model):
    """Make every layer of ``model`` keep packed examples apart; returns ``model``.

    Layers that carry state along the sequence (Gated DeltaNet, Mamba/Mamba2, short convolutions,
    KDA, lightning attention, RG-LRU) are found by their structure and run per example, or on
    flash-linear-attention's varlen kernels for Gated DeltaNet on a GPU; the boundaries come from
    the batch (``cu_seq_lens_q`` or restarting ``position_ids``, as :class:`FlatteningCollator` and
    :class:`PrePackedCollator` emit them). Calling it again changes nothing. The log says which
    path each layer kind takes; ``packing_layers(model)`` returns the same.

    >>> from transformers import Qwen3_5TextConfig, Qwen3_5ForCausalLM
    >>> config = Qwen3_5TextConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
    ...     num_key_value_heads=1, head_dim=8, intermediate_size=16, linear_num_key_heads=2,
    ...     linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    ...     layer_types=["linear_attention", "full_attention"], use_cache=False)
    >>> model = enable_packing(Qwen3_5ForCausalLM(config))
    >>> packing_layers(model).counts
    {'Qwen3_5GatedDeltaNet': 1, 'attention': 1}
    """
    return prepare_model(model, fla_kernels)


def prepare_model(model, find_kernels):
    """``enable_packing`` with the Gated DeltaNet kernels from ``find_kernels() -> (kernels | None, why not)``."""
    from .._model_unwrap import unwrap_model

    inner = unwrap_model(model)
    state = getattr(inner, _STATE, None)
    if state is not None:
        return model
    state = PackingLayers()
    layers = find_stateful_layers(inner)
    kernels, why_not = (None, "")
    if any(gated_deltanet_layout(layer) for _, layer in layers):
        kernels, why_not = find_kernels()
        if kernels is None and (torch.cuda.is_available() or "not importable" not in why_not):
            logger.warning("enable_packing: Gated DeltaNet layers run per example (exact, slower): %s.", why_not)
    counts: Counter = Counter()
    for _, layer in layers:
        path, layout = _path(layer, kernels, why_not)
        name = type(layer).__name__
        state.paths.setdefault(name, path)
        counts[name] += 1
        layer.forward = _stateful_forward(layer, layer.forward, state, kernels, layout)
    state.counts = dict(counts)
    state.stateful = tuple(counts)
    if layers:
        _rebuild_attention_masks(inner, state, {id(layer) for _, layer in layers})
    multimodal = multimodal_model(inner)
    if layers or multimodal is not None:  # a plain transformer needs nothing: no hook, nothing for compile to trace
        state.checkpointed = tuple(
            m for m in inner.modules() if hasattr(m, "gradient_checkpointing") and m is not inner
        )
        _install_hooks(inner, state)
    if multimodal is not None:
        multimodal.register_forward_pre_hook(MultimodalPositions(multimodal, state), with_kwargs=True)
        state.multimodal = type(multimodal).__name__
        state.paths["multimodal rotary positions"] = f"{state.multimodal}.get_rope_index per example"
        state.counts["multimodal rotary positions"] = 1
    setattr(inner, _STATE, state)
    logger.info("enable_packing(%s): %s", type(inner).__name__, state.summary())
    return model
