"""enable_packing(model): every layer of the model keeps the packed examples of a batch apart.

    model(input_ids (1, T), position_ids, cu_seq_lens_q, ...)
      PackingRuntime.open (pre-hook): the call's scope, its examples read once      (_scope.py)
        Gated DeltaNet, Mamba2, short conv, KDA, lightning -> fla's varlen kernels, on CUDA (fast)  (_varlen.py)
        any other stateful layer, or no kernels here -> the layer per example, padded  (exact anywhere)
        attention              -> as before: cu_seq_lens (flash, packing_varlen) or the packed mask
        multimodal module      -> its rotary positions per example                    (_multimodal.py)
      PackingRuntime.close (hook): the scope ends

What is installed, and nothing else (each piece an object a deep copy or a pickle carries along):

    model._packing_runtime      PackingRuntime: the calls' scopes                          (_scope.py)
    model, base model hooks     runtime.open (pre-hook), runtime.close (hook, always called)
    stateful layer .forward     StatefulForward(layer): its path in a packed call, else its own forward
    attention layer .forward    PackedMaskForward(layer): the mask cut by example (sdpa, eager)
    multimodal module pre-hook  MultimodalPositions: rotary positions per example          (_multimodal.py)
    checkpointed layers         CarryScope on their checkpoint function, set by runtime.open in training

Each is installed where it is missing, so calling it again, or on the model after its base model,
changes nothing, and a layer that PEFT wrapped or copied is prepared like the others;
``packing_layers(model)`` reports what is installed. Cost: one walk over the modules; each stateful
layer then runs as its path says.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import torch

from ._kernels import HYBRID_EXTRA, VarlenKernels, fla_kernels
from ._mixers import find_stateful_layers
from ._multimodal import MultimodalPositions, multimodal_model
from ._packed_mask import PackedMaskForward, is_causal_attention
from ..batch import CU_SEQ_LENS_Q, KV_INDEX, PACKING_KEYS, Q_INDEX
from ._per_example import LayerArguments, run_per_example
from ._row_segments import RowSegments
from ._scope import CACHE_KEYWORDS, LayerForward, PackingRuntime
from ._varlen import VarlenLayer, run_varlen, varlen_layer
from ._wrappers import refuse_prompt_learning

__all__ = ["PackingLayers", "enable_packing", "enable_packing_with", "packing_layers"]

logger = logging.getLogger(__name__)

_RUNTIME = "_packing_runtime"  # the prepared module's PackingRuntime
PER_EXAMPLE = "per example (the layer run on the row's examples as one padded batch; exact, no kernel needed)"
ATTENTION = (
    "cu_seq_lens under flash / packing_varlen; under sdpa and eager the model's mask with nothing across examples"
)


@dataclass(frozen=True)
class PackingLayers:
    """What ``enable_packing`` installed in a model: each stateful layer kind and the path it takes.

    Attributes:
        paths: ``{layer class: path}`` (``"attention"`` and ``"multimodal rotary positions"`` too).
        counts: ``{layer class: how many}``, in the same order.
        stateful: the classes of the layers that carry state along the sequence.
        multimodal: the class that numbers multimodal positions per example, or None.
    """

    paths: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    stateful: tuple[str, ...] = ()
    multimodal: str | None = None

    def summary(self) -> str:
        if not self.paths:
            return "no layer carries state along the sequence; attention keeps the examples apart"
        return "; ".join(f"{name} x{self.counts[name]}: {path}" for name, path in self.paths.items())


def _runtime(model) -> PackingRuntime | None:
    """The runtime of ``model`` or of the module inside it that ``enable_packing`` prepared."""
    for module in model.modules():
        runtime = module.__dict__.get(_RUNTIME)
        if runtime is not None:
            return runtime
    return None


def packing_layers(model) -> PackingLayers | None:
    """What ``enable_packing`` installed in ``model`` (or a module inside it), None if it was not called."""
    from .._model_unwrap import unwrap_model

    inner = unwrap_model(model)
    if _runtime(inner) is None:
        return None
    paths, counts, attention, multimodal = {}, Counter(), 0, None
    for module in inner.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, StatefulForward):
            paths.setdefault(forward.arguments.layer, forward.path)
            counts[forward.arguments.layer] += 1
        attention += isinstance(forward, PackedMaskForward)
        if any(isinstance(hook, MultimodalPositions) for hook in module._forward_pre_hooks.values()):
            multimodal = type(module).__name__
    stateful = tuple(paths)
    if attention:
        paths["attention"], counts["attention"] = ATTENTION, attention
    if multimodal is not None:
        paths["multimodal rotary positions"] = f"{multimodal}.get_rope_index per example"
        counts["multimodal rotary positions"] = 1
    return PackingLayers(paths, dict(counts), stateful, multimodal)


def _check_call(name: str, segments: RowSegments, hidden: torch.Tensor | None, kwargs: dict) -> None:
    if hidden is None or tuple(hidden.shape[:2]) != segments.batch_shape:
        got = None if hidden is None else tuple(hidden.shape)
        raise RuntimeError(
            f"{name} was called with hidden states {got} inside a call of the model with a batch of "
            f"{segments.batch_shape}: its examples' boundaries are unknown. Call the model itself (its forward "
            "reads the boundaries), one packed batch at a time."
        )
    if any(_holds_tokens(kwargs.get(key)) for key in CACHE_KEYWORDS):
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
    cu = kwargs.get(CU_SEQ_LENS_Q)
    if cu is not None and cu.numel() > 2:
        raise RuntimeError(
            f"{name} got cu_seq_lens_q of {cu.numel() - 1} examples outside a call of the model (its boundaries "
            "pre-hook did not run). Call the model itself with the packed batch."
        )
    return {k: v for k, v in kwargs.items() if k not in PACKING_KEYS}


class StatefulForward(LayerForward):
    """A stateful layer's forward: with a packed batch in the call's scope, its path (varlen kernels or per
    example); otherwise the layer's own forward, without the packing keywords."""

    def __init__(
        self, layer, runtime: PackingRuntime, path: str, kernels: VarlenKernels | None = None,
        varlen: VarlenLayer | None = None,
    ) -> None:  # fmt: skip
        super().__init__(layer, runtime)
        self.path, self.kernels, self.varlen = path, kernels, varlen
        self.arguments = LayerArguments.of(type(layer).__name__, self.original_forward())

    def __call__(self, *args, **kwargs):
        scope = self.runtime.scope
        if scope is not None and scope.kv_index is not None:  # a shared prompt
            hidden = self.arguments.hidden_states(args, kwargs)
            if self._prompts_once(hidden, args, kwargs) and scope.shared_prefix() is not None:
                row = hidden.reshape(1, -1, hidden.shape[-1])
                out = self.varlen.family.shared(self.layer, row, scope, self.kernels, self.varlen.layout)
                if isinstance(out, tuple):  # MiniMax's layer returns (output, its state: None)
                    return (out[0].reshape(*hidden.shape[:2], *out[0].shape[2:]), *out[1:])
                return out.reshape(*hidden.shape[:2], *out.shape[2:])
            # else on the keys' layout: the prompt once per completion
            args = tuple(scope.to_keys(a) for a in args)
            kwargs = {k: v if k in (KV_INDEX, Q_INDEX) else scope.to_keys(v) for k, v in kwargs.items()}
            return scope.to_queries(self._run(*args, **kwargs))
        return self._run(*args, **kwargs)

    def _prompts_once(self, hidden, args, kwargs) -> bool:
        """Whether this layer runs a shared-prompt row with each prompt once: a family with that path (on kernels
        that take initial states where it starts completions from states), on their device, no padding mask."""
        kernels, varlen = self.kernels, self.varlen
        if varlen is None or varlen.family.shared is None or kernels is None:
            return False
        if varlen.family.shared_needs_states and not kernels.prefix_states:
            return False
        mask = self.arguments.named(args, kwargs).get("attention_mask")
        padded = isinstance(mask, torch.Tensor) and mask.dim() == 2
        return hidden is not None and hidden.device.type == kernels.device_type and not padded

    def _run(self, *args, **kwargs):
        segments = self.runtime.segments
        name = self.arguments.layer
        if segments is None:  # one example per row: the layer's own code, without the packing keywords
            return self.call_original(*args, **_unpacked(name, kwargs))
        hidden = self.arguments.hidden_states(args, kwargs)
        _check_call(name, segments, hidden, kwargs)
        kernels = self.kernels
        if self.varlen is not None and kernels is not None and hidden.device.type == kernels.device_type:
            mask = self.arguments.named(args, kwargs).get("attention_mask")
            return run_varlen(self.varlen, self.layer, hidden, segments.cu_seq_lens, kernels, mask)
        return run_per_example(self.call_original, self.arguments, segments, args, kwargs)


def _path(varlen: VarlenLayer | None, kernels: VarlenKernels | None, why_not: str) -> tuple[str, bool]:
    """The layer's path in words, and whether it runs on the kernels (on their device)."""
    if varlen is None:
        return PER_EXAMPLE, False
    if kernels is None:
        return f"{PER_EXAMPLE}; the varlen kernels are not used: {why_not}", False
    missing = kernels.missing(varlen.family.needs)
    if missing:
        why = kernels.why_missing or f"{kernels.name} has no {' or '.join(missing)} kernel with cu_seqlens"
        return f"{PER_EXAMPLE}; {why}", False
    where = "CUDA" if kernels.device_type == "cuda" else kernels.device_type
    family = varlen.family
    shared = family.shared is not None and (kernels.prefix_states or not family.shared_needs_states)
    once = "; a shared prompt once, its completions from its state" if shared else ""
    return f"{kernels.name} varlen kernels on {where} ({varlen.describe()}{once}), {PER_EXAMPLE} elsewhere", True


def _installed(module, kind: type) -> bool:
    return isinstance(module.__dict__.get("forward"), kind)


def _log_slow_layers(slow: Counter, reasons: dict) -> None:
    """One line for the layers with a varlen path that run per example: a warning where CUDA is (or where an fla too
    old for varlen is installed), else for information (a CPU has no use for the kernels)."""
    if not slow:
        return
    why = "; ".join(reasons)
    level = logging.WARNING if torch.cuda.is_available() or "not importable" not in why else logging.INFO
    kinds = ", ".join(f"{name} x{count}" for name, count in slow.items())
    logger.log(level, "enable_packing: %s run per example (exact, slower): %s. %s brings flash-linear-attention's "
               "varlen kernels (CUDA).", kinds, why, HYBRID_EXTRA)  # fmt: skip


def _prepare_stateful_layers(layers: list, runtime: PackingRuntime, find_kernels) -> None:
    """Each stateful layer not prepared yet gets a ``StatefulForward`` with its path."""
    varlen = [varlen_layer(layer) for layer in layers]
    kernels, why_not = find_kernels() if any(varlen) else (None, "")
    slow, reasons = Counter(), {}
    for layer, spec in zip(layers, varlen):
        path, fast = _path(spec, kernels, why_not)
        if spec is not None and not fast:
            slow[type(layer).__name__] += 1
            reasons[why_not or path.split("; ", 1)[-1]] = None
        StatefulForward(layer, runtime, path, kernels if fast else None, spec if fast else None).install()
    _log_slow_layers(slow, reasons)


def _mask_attention_by_example(model, runtime: PackingRuntime) -> None:
    """Causal attention layers get the packed batch's mask under sdpa/eager/flex (see _packed_mask)."""
    from .._model_unwrap import text_config

    config = text_config(model)
    for module in model.modules():
        if _installed(module, LayerForward) or not is_causal_attention(module):
            continue
        PackedMaskForward(module, runtime, getattr(module, "config", config)).install()


def _hooked(module, hooks: dict, function) -> bool:
    return any(getattr(hook, "__func__", None) is function for hook in hooks.values())


def _install_hooks(model, runtime: PackingRuntime) -> None:
    """The runtime's hooks on the model and on its base model (PEFT calls the model's forward directly)."""
    owners = [model]
    base = getattr(model, "base_model", None) if hasattr(model, "base_model_prefix") else None
    if isinstance(base, torch.nn.Module) and base is not model:
        owners.append(base)
    for module in owners:
        if not _hooked(module, module._forward_pre_hooks, PackingRuntime.open):
            module.register_forward_pre_hook(runtime.open, with_kwargs=True, prepend=True)
            module.register_forward_hook(runtime.close, with_kwargs=True, always_call=True)


def enable_packing(model):
    """Make every layer of ``model`` keep packed examples apart; returns ``model``.

    Layers that carry state along the sequence (Gated DeltaNet, Mamba/Mamba2, short convolutions,
    KDA, lightning attention, RG-LRU) are found by their structure and run per example, or on
    flash-linear-attention's varlen kernels on a GPU (Gated DeltaNet, Mamba2, short convolutions, KDA,
    lightning attention; ``pip install "packing-collators[hybrid]"``); the boundaries come from
    the batch (``cu_seq_lens_q`` or restarting ``position_ids``, as :class:`FlatteningCollator` and
    :class:`PrePackedCollator` emit them). Calling it again changes nothing. The log says which
    path each layer kind takes; ``packing_layers(model)`` returns the same. A PEFT model with prompt
    or prefix tuning is refused (its virtual tokens come once per packed row, not per example).

    >>> from transformers import Qwen3_5TextConfig, Qwen3_5ForCausalLM
    >>> config = Qwen3_5TextConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
    ...     num_key_value_heads=1, head_dim=8, intermediate_size=16, linear_num_key_heads=2,
    ...     linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    ...     layer_types=["linear_attention", "full_attention"], use_cache=False)
    >>> model = enable_packing(Qwen3_5ForCausalLM(config))
    >>> packing_layers(model).counts
    {'Qwen3_5GatedDeltaNet': 1, 'attention': 1}
    """
    return enable_packing_with(model, fla_kernels)


def _follow_cache_switch(model) -> None:
    """``model.config.use_cache = False`` reaches the language model: a vision-language model loaded from a flat
    checkpoint config keeps ``use_cache`` in its text config, which its forward reads and the top-level switch
    does not change (the README's and the checks' advice would otherwise do nothing)."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config and config.__dict__.get("use_cache") is False and getattr(text, "use_cache", False):
        text.use_cache = False
        logger.info("enable_packing: model.config.use_cache = False applied to the text config too")


def enable_packing_with(model, find_kernels):
    """``enable_packing`` with the varlen kernels from ``find_kernels() -> (VarlenKernels | None, why not)``."""
    from .._model_unwrap import unwrap_model

    refuse_prompt_learning(model)
    inner = unwrap_model(model)
    _follow_cache_switch(inner)
    runtime = _runtime(inner)
    if runtime is None:
        runtime = PackingRuntime(inner)
        setattr(inner, _RUNTIME, runtime)
    layers = [layer for _, layer in find_stateful_layers(inner)]
    _prepare_stateful_layers([m for m in layers if not _installed(m, StatefulForward)], runtime, find_kernels)
    if layers:
        _mask_attention_by_example(inner, runtime)
    multimodal = multimodal_model(inner)
    if layers or multimodal is not None:  # a plain transformer needs nothing: no hook, nothing for compile to trace
        _install_hooks(inner, runtime)
    hooks = multimodal._forward_pre_hooks.values() if multimodal is not None else ()
    if multimodal is not None and not any(isinstance(hook, MultimodalPositions) for hook in hooks):
        multimodal.register_forward_pre_hook(MultimodalPositions(multimodal, runtime), with_kwargs=True)
    logger.info("enable_packing(%s): %s", type(inner).__name__, packing_layers(inner).summary())
    return model
