"""The forward's scope: the examples of the batch that one call of the model runs, opened and closed in one place.

    model(**batch)                       PackingRuntime: one per prepared model, shared by its layers
      pre-hook  runtime.open        ->   scope = ForwardScope(segments, generating)   (the outermost call)
        stateful layer, attention   ->   read runtime.scope: keep its examples apart
        checkpointed layer          ->   CarryScope: its recompute in the backward runs in this scope
      hook      runtime.close       ->   scope = None                                 (even if it raised)

The boundaries come from what the collators emit (``cu_seq_lens_q``, else restarting
``position_ids``); a call that passes a cache (``generate``) opens a scope with nothing packed in
it: the cache carries one sequence's state from call to call, and left padding restarts the
positions without starting examples. Gradient checkpointing recomputes a layer during the backward,
after the forward has closed its scope (and a second forward may have opened another): the layer's
checkpoint function is wrapped (``CarryScope``) so that the recompute runs in its forward's scope.

Nothing here holds a layer or the model in a closure. The hooks are the runtime's own methods, the
layers' forwards are objects that hold their layer (``LayerForward``), so ``copy.deepcopy`` of the
whole model gives the copy a runtime of its own that its own layers read, while a deep copy of one
layer (PEFT's ``modules_to_save``) shares its model's runtime: it runs inside that model's forward.
A pickled model (``torch.save(model)``) loads with its runtime and its layers' forwards.
Cost: one read of the boundaries per forward, a walk over the modules per training forward.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from dataclasses import dataclass, field
from functools import partial
from types import MethodType
from typing import Any

import torch

from ..batch import CU_SEQ_LENS_K, CU_SEQ_LENS_Q, KV_INDEX, Q_INDEX
from ._row_segments import RowSegments, row_segments

__all__ = ["CACHE_KEYWORDS", "CarryScope", "ForwardScope", "LayerForward", "PackingRuntime", "read_scope"]

logger = logging.getLogger(__name__)

CACHE_KEYWORDS = ("cache", "past_key_values", "cache_params")


@dataclass(eq=False)
class ForwardScope:
    """What one call of the model keeps apart.

    Attributes:
        segments: the examples of the batch (None: one example per row, nothing to keep apart).
        generating: whether the call passed a cache (``generate``): nothing in it is packed.
        masks: the packed attention masks made in this call, ``(model's mask, implementation, dtype,
            packed)``: the layers that get the same mask share one (see ``_packed_mask``).
        same_example: bool (B, 1, T, T), the causal "same example" mask they are made from.
        kv_index, q_index: a layout whose keys differ from its queries (a shared prompt: the keys repeat
            it): the row position of each key, and each row token's key position. ``segments`` are then
            the keys' examples, which layers that carry state run on (``to_keys``, then ``to_queries``).
    """

    segments: RowSegments | None = None
    generating: bool = False
    masks: list = field(default_factory=list)
    same_example: torch.Tensor | None = None
    kv_index: torch.Tensor | None = None
    q_index: torch.Tensor | None = None
    _prefix: tuple | None = field(default=None, repr=False)
    _windows: dict = field(default_factory=dict, repr=False)  # (width, device) -> KeyWindow

    def shared_prefix(self):
        """The two passes a recurrence takes over a shared-prompt row (``_shared_prefix.py``), made once per call;
        None where no prompt is shared."""
        if self._prefix is None:
            from ._shared_prefix import shared_prefix

            self._prefix = (shared_prefix(self.kv_index, self.q_index, self.segments.cu_seq_lens),)
        return self._prefix[0]

    def key_window(self, width: int, device):
        """The keys' layout cut to a causal window of ``width`` (``_shared_prefix.key_window``), made once per call
        on the host and copied to ``device`` once."""
        key = (int(width), torch.device(device))
        if key not in self._windows:
            from ._shared_prefix import key_window

            self._windows[key] = key_window(self.kv_index, self.q_index, self.segments.cu_seq_lens, width).to(device)
        return self._windows[key]

    def to_keys(self, value):
        """``value`` laid out as the keys (``kv_index``): a (B, T, ...) tensor gathered along T, a tuple's tensors too
        (rotary ``position_embeddings``, (cos, sin)), else as is."""
        if isinstance(value, tuple) and self.kv_index is not None:
            return tuple(self.to_keys(v) for v in value)
        if self.kv_index is None or not isinstance(value, torch.Tensor) or value.dim() < 2:
            return value
        if value.shape[1] != self.q_index.numel():
            return value
        return value.index_select(1, self.kv_index.to(value.device))

    def to_queries(self, value):
        """The row's tokens of a keys-layout output (``q_index``), in a tuple's tensors too."""
        if isinstance(value, tuple):
            return tuple(self.to_queries(v) for v in value)
        if not isinstance(value, torch.Tensor) or value.dim() < 2 or value.shape[1] != self.kv_index.numel():
            return value
        return value.index_select(1, self.q_index.to(value.device))


def _batch_shape(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    for key in ("input_ids", "inputs_embeds"):
        if isinstance(kwargs.get(key), torch.Tensor):
            return tuple(kwargs[key].shape[:2])
    if args and isinstance(args[0], torch.Tensor):
        return tuple(args[0].shape[:2])
    return None


def passes_cache(kwargs: dict) -> bool:
    """Whether a call hands the model a cache (``generate``): the call continues one sequence per row."""
    return any(kwargs.get(key) is not None for key in CACHE_KEYWORDS)


def read_scope(module, args: tuple, kwargs: dict) -> ForwardScope:
    """The scope of a call of ``module`` (the model): its examples, from cu_seq_lens_q or position_ids."""
    shape = _batch_shape(args, kwargs)
    if shape is None:
        return ForwardScope()
    if passes_cache(kwargs):  # generate(): one sequence per row, its state carried by the cache
        return ForwardScope(generating=True)
    positions = kwargs.get("position_ids")
    if positions is None and args:  # (input_ids, attention_mask, position_ids, ...) given positionally
        positions = inspect.signature(module.forward).bind_partial(*args).arguments.get("position_ids")
    kv_index = kwargs.get(KV_INDEX)
    if kv_index is not None:  # keys laid out apart from the queries: the examples are the keys'
        segments = row_segments((1, kv_index.numel()), cu_seq_lens=kwargs.get(CU_SEQ_LENS_K))
        return ForwardScope(segments=segments, kv_index=kv_index, q_index=kwargs.get(Q_INDEX))
    segments = row_segments(shape, cu_seq_lens=kwargs.get(CU_SEQ_LENS_Q), position_ids=positions)
    return ForwardScope(segments=segments)


class PackingRuntime:
    """A prepared model's runtime: opens a :class:`ForwardScope` per call and holds it for the layers.

    ``open`` is a forward pre-hook on the model and on its base model (PEFT calls the model's
    ``forward`` directly, past its hooks): the first of them to run opens the call's scope, and the
    same module's ``close`` (a forward hook that runs even when the forward raises) closes it.
    """

    def __init__(self, owner) -> None:
        self._owner = weakref.ref(owner)  # the module enable_packing prepared (no cycle through it)
        self.scope: ForwardScope | None = None
        self._opener = None  # the module whose call opened the scope
        self.forwards: list[LayerForward] = []  # every layer forward installed for this model

    @property
    def owner(self):
        return self._owner()

    @property
    def segments(self) -> RowSegments | None:
        """The examples of the call under way (None: not packed, or no call under way)."""
        return None if self.scope is None else self.scope.segments

    @property
    def generating(self) -> bool:
        return self.scope is not None and self.scope.generating

    def open(self, module, args: tuple, kwargs: dict) -> None:
        if self.scope is not None and self._opener is not module:
            return None  # the base model inside the same call: already open
        self.scope, self._opener = read_scope(module, args, kwargs), module
        self._keep_installed()
        if module.training and torch.is_grad_enabled():
            self._carry_into_recomputes(module)
        return None

    def _keep_installed(self) -> None:
        """Put back a layer forward something took off its layer since: transformers (5.25, with ``kernels``
        installed) kernelizes a ``from_pretrained`` model again when it changes mode (``model.train()``), which
        resets each layer's ``forward``, so a packed call would run the layer's own, which mixes examples."""
        for forward in self.forwards:
            if forward.layer.__dict__.get("forward") is not forward:
                logger.debug("enable_packing: %s's forward was reset; installed again", type(forward.layer).__name__)
                forward.layer.forward = forward

    def close(self, module, args: tuple, kwargs: dict, output: Any = None) -> None:
        if module is self._opener:
            self.scope = self._opener = None
        return None

    def run_in(self, scope: ForwardScope | None, function, *args, **kwargs):
        """``function(*args, **kwargs)`` with ``scope`` open (a checkpointed layer's recompute)."""
        saved, self.scope = self.scope, scope
        try:
            return function(*args, **kwargs)
        finally:
            self.scope = saved

    def _carry_into_recomputes(self, model) -> None:
        """Wrap each checkpointed layer's checkpoint function (``gradient_checkpointing_enable`` sets it, before
        or after ``enable_packing``) so that its recompute runs in the scope of its own forward."""
        for module in model.modules():
            checkpoint = module.__dict__.get("_gradient_checkpointing_func")
            if getattr(module, "gradient_checkpointing", False) and checkpoint is not None:
                if not (isinstance(checkpoint, CarryScope) and checkpoint.runtime is self):
                    inner = checkpoint.checkpoint if isinstance(checkpoint, CarryScope) else checkpoint
                    module._gradient_checkpointing_func = CarryScope(inner, self)

    def __deepcopy__(self, memo: dict) -> PackingRuntime:
        owner = self.owner
        if owner is None or id(owner) not in memo:
            return self  # one layer copied (PEFT's modules_to_save): it runs in this model's forward
        return PackingRuntime(memo[id(owner)])  # the whole model copied: its copy opens its own scopes

    def __getstate__(self) -> dict:  # torch.save(model): the owner pickled with the model, no call under way
        return {"owner": self.owner}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["owner"])

    def __repr__(self) -> str:
        return f"PackingRuntime({type(self.owner).__name__}, scope={'open' if self.scope else 'closed'})"


class CarryScope:
    """A checkpointed layer's checkpoint function: the layer's recompute runs in the scope of its forward."""

    def __init__(self, checkpoint, runtime: PackingRuntime) -> None:
        self.checkpoint, self.runtime = checkpoint, runtime

    def __call__(self, function, *args, **kwargs):
        return self.checkpoint(partial(self.runtime.run_in, self.runtime.scope, function), *args, **kwargs)


class LayerForward:
    """The base of a layer's forward under ``enable_packing``: it holds its layer (a deep copy of the layer
    holds the copy) and calls the layer's own forward, which ``inspect.signature`` reports."""

    def __init__(self, layer, runtime: PackingRuntime) -> None:
        self.layer, self.runtime = layer, runtime
        self.original = layer.__dict__.get("forward")  # a forward set on the instance before; None: the class's

    def original_forward(self):
        """The layer's forward as it was before: the one set on the instance, else its class's, bound."""
        return self.original if self.original is not None else MethodType(type(self.layer).forward, self.layer)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.original_forward())

    def call_original(self, *args, **kwargs):
        return self.original_forward()(*args, **kwargs)

    def install(self) -> None:
        self.layer.forward = self
        self.runtime.forwards.append(self)
