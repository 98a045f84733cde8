"""A causal LM's output head as the chunked loss needs it, and the one forward that checks it on the model.

    model.forward:  ... -> hidden (B, T, H) -> lm_head (nn.Linear: W (V, H), b) -> logits -> [scale, soft cap]
                                                                                            -> + coef * aux_loss (MoE)
    OutputHead:     module = lm_head, transform = LogitTransform(scale, softcap), aux_coef

What follows the projection is read from the text config, as transformers' models apply it:
``logit_scale`` (Cohere), ``1 / logits_scaling`` (Granite; HyperCLOVA X multiplies),
``lm_head_multiplier`` (Falcon-H1), ``output_multiplier``, ``final_logit_softcapping`` (Gemma 2/3);
an MoE model adds ``router_aux_loss_coef * aux_loss`` to its loss. Reading is not trusting:
:func:`check_output_head` runs the model once on a few tokens with its real head and compares its
logits with the head's projection of the hidden states it received, and its loss with
``cross_entropy + coef * aux_loss``. A model whose head does something else (a head that is not
an ``nn.Linear``, a transform this does not know) keeps the full-logit loss, and the reason is logged.
Cost: one forward over a few tokens, once per model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Literal

import torch

from .._model_unwrap import text_config, unwrap_model
from ._chunked import LogitTransform, _project

__all__ = [
    "HEAD_CHECK_TOKENS",
    "CheckedHeads",
    "LossImplementation",
    "OutputHead",
    "check_output_head",
    "checked_head",
    "head_call",
    "output_head",
]

HEAD_CHECK_TOKENS = 16
"""The tokens of the one row :func:`check_output_head` runs the model on (a trainer's FA4 warm-up meets its layout)."""

logger = logging.getLogger(__name__)


LossImplementation = Literal["auto", "chunked", "full"]


@dataclass(frozen=True)
class OutputHead:
    """The output embedding (``nn.Linear``) of a causal LM, what the model does after it, its MoE loss weight, and
    whether its projection runs in float32 outside autocast (``float32``: TRL's ``cast_lm_head_to_fp32``, which
    casts the head's weight to float32 and projects ``hidden.float()`` with autocast off)."""

    module: torch.nn.Module
    transform: LogitTransform
    aux_coef: float
    float32: bool = False


def _logit_transform(config) -> LogitTransform:
    scale = getattr(config, "logit_scale", None)
    for name in ("output_multiplier", "lm_head_multiplier"):
        scale = getattr(config, name, None) if scale is None else scale
    scaling = getattr(config, "logits_scaling", None)
    if scale is None and scaling:
        scale = scaling if getattr(config, "model_type", "") == "hyperclovax" else 1.0 / scaling
    softcap = getattr(config, "final_logit_softcapping", None)
    return LogitTransform(float(1.0 if scale is None else scale), float(softcap) if softcap else None)


def output_head(model) -> tuple[OutputHead | None, str]:
    """``model``'s :class:`OutputHead`, or None and why the chunked loss cannot use it.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                                      intermediate_size=8))
    >>> head, why = output_head(model)
    >>> type(head.module).__name__, head.transform, head.aux_coef
    ('Linear', LogitTransform(scale=1.0, softcap=None, temperature=1.0), 0.0)
    """
    inner = unwrap_model(model)
    getter = getattr(inner, "get_output_embeddings", None)
    module = getter() if callable(getter) else None
    if module is None:
        return None, f"{type(inner).__name__} has no output embedding (get_output_embeddings() is None)"
    if type(module).forward is not torch.nn.Linear.forward or not isinstance(module, torch.nn.Linear):
        return None, f"its output head is a {type(module).__name__}, not an nn.Linear (a wrapper such as LoRA on lm_head)"
    config = text_config(inner)
    coef = getattr(inner, "router_aux_loss_coef", None)
    coef = getattr(config, "router_aux_loss_coef", 0.0) if coef is None else coef
    return OutputHead(module, _logit_transform(config), float(coef or 0.0)), ""


@contextlib.contextmanager
def head_call(head: OutputHead, compute):
    """While open, the model's call of its head runs ``compute(hidden (B, T, H))`` instead of the projection.

    ``compute`` returns what the head returns to the model (an empty ``(B, T, 0)`` tensor, so that
    what the model does to its logits costs nothing). The head's own forward hooks still run around
    it (DeepSpeed ZeRO-3 gathers the weight there, FSDP has unsharded it), so ``compute`` reads
    ``head.module.weight`` whole. The previous ``forward`` comes back on exit.
    """
    module = head.module
    had, previous = "forward" in module.__dict__, module.__dict__.get("forward")
    module.forward = compute
    try:
        yield
    finally:
        if had:
            module.forward = previous
        else:
            del module.forward


def _check_tokens(config, device, count: int = HEAD_CHECK_TOKENS) -> torch.Tensor:
    """(1, count) token ids that no config field names as special (pad, eos, an image placeholder, ...):
    the same on every rank, so every rank of a sharded model runs the same check."""
    special: set[int] = set()
    for key, value in vars(config).items():
        if key.endswith(("token_id", "token_ids", "token_index")):
            special.update(v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, int))
    vocab = int(config.vocab_size)
    allowed = [t for t in range(min(vocab, 4096)) if t not in special]
    step = max(1, len(allowed) // count)
    return torch.tensor(allowed[::step][:count], device=device)[None]


def check_output_head(model, head: OutputHead) -> str:
    """Run ``model`` once on ``HEAD_CHECK_TOKENS`` tokens; "" if its logits and loss are what ``head`` computes from the hidden
    states its head received, else what differs.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    >>> model = LlamaForCausalLM(config)
    >>> check_output_head(model, output_head(model)[0])
    ''
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):  # float32 weights under mixed precision (Trainer bf16=True)
    ...     check_output_head(model, output_head(model)[0])
    ''
    >>> config.logit_scale = 0.5  # a scale the model's forward does not apply
    >>> check_output_head(model, output_head(model)[0]).startswith("its logits differ from its head's projection")
    True
    """
    from ..collate import FlatteningCollator

    tokens = _check_tokens(text_config(model), head.module.weight.device)
    batch = FlatteningCollator()([{"input_ids": tokens[0].tolist()}])  # the packed layout training feeds
    batch = {k: v.to(tokens.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    seen: dict = {}
    original = head.module.forward

    def record(hidden):
        # autocast as the head's call sees it: accelerate's mixed precision wraps the model's forward, not this check
        seen["hidden"], seen["autocast"] = hidden, _autocast_on(hidden)
        return original(hidden)

    with torch.no_grad(), head_call(head, record):
        out = model(**batch)
    logits = out["logits"].float()
    hidden, weight = seen["hidden"], head.module.weight
    with torch.no_grad():
        ours = head.transform.apply(_project(hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype), weight, head.module.bias))
    scale = max(1.0, float(logits.abs().max()))
    # the model's head ran in the hidden states' dtype (or autocast's): bf16 logits round at 2^-8 relative
    exact = hidden.dtype == weight.dtype == torch.float32 and not seen["autocast"]
    tolerance = 1e-4 if exact else 3e-2
    difference = float((ours.reshape(logits.shape) - logits).abs().max()) / scale
    if difference > tolerance:
        return (
            f"its logits differ from its head's projection of the hidden states by {difference:.3g} (relative; "
            f"tolerance {tolerance:g}): the model does something after its head that {head.transform} does not"
        )
    return _check_aux(out, logits, tokens, head)


def _autocast_on(tensor: torch.Tensor) -> bool:
    try:
        return torch.is_autocast_enabled(tensor.device.type)
    except TypeError:  # torch < 2.4 takes no device
        return torch.is_autocast_enabled() if tensor.is_cuda else torch.is_autocast_cpu_enabled()


def _check_aux(out, logits: torch.Tensor, tokens: torch.Tensor, head: OutputHead) -> str:
    """"" if the model's loss is cross-entropy on its logits plus ``aux_coef * aux_loss``, else what differs."""
    loss = out.get("loss")
    if loss is None:
        return "it returns no loss for labels"
    ce = torch.nn.functional.cross_entropy(logits[0, :-1], tokens[0, 1:].to(logits.device))
    aux = out.get("aux_loss")
    extra = head.aux_coef * float(aux) if aux is not None else 0.0
    implied = float(loss) - float(ce)
    # both sides read the same logits in float32: only summation order (and a bf16 aux loss) separates them
    if abs(implied - extra) > 1e-5 * max(1.0, abs(float(loss))) + 1e-2 * abs(extra):
        return (
            f"its loss is cross-entropy plus {implied:.4g}, where router_aux_loss_coef * aux_loss gives {extra:.4g}: "
            "its loss adds something this does not know"
        )
    return ""


def checked_head(model, implementation: LossImplementation = "auto", *, probe=None) -> tuple[OutputHead | None, str]:
    """The head the chunked loss computes for ``model``, checked on it (``probe``: the module to run, default
    ``model``), or None and why the full logits are used. ``"chunked"`` raises instead of falling back."""
    head, why = (None, "loss_implementation='full'") if implementation == "full" else output_head(model)
    if head is not None:
        why = check_output_head(model if probe is None else probe, head)
        head = None if why else head
    if head is None and implementation == "chunked":
        raise ValueError(f"loss_implementation='chunked' cannot be used with {type(unwrap_model(model)).__name__}: {why}.")
    return head, why


class CheckedHeads:
    """Each model's head, checked once (:func:`checked_head`) and kept by model: what a trainer scoring several models
    (a policy, its reference) computes log-probabilities with. None where the chunked path cannot compute the
    head (a PEFT ``modules_to_save`` copy of ``lm_head``): the model's own full logits then, the same numbers,
    said once in the log by ``who``. ``float32``: every head projects in float32 outside autocast
    (:class:`OutputHead`), as a trainer that cast its models' heads to float32 computes them."""

    def __init__(self, who: str, float32: bool = False) -> None:
        self.who, self.float32, self._heads, self._why = who, float32, {}, {}

    def __call__(self, model) -> OutputHead | None:
        inner = unwrap_model(model)
        if id(inner) not in self._heads:
            self._heads[id(inner)], self._why[id(inner)] = checked_head(inner)
            why = self._why[id(inner)]
            if self._heads[id(inner)] is None:
                logger.warning("%s: %s: log-probabilities from the full logits (%s)", self.who, type(inner).__name__, why)
        head = self._heads[id(inner)]
        if head is None and self.float32:
            raise ValueError(
                f"{self.who}: cast_lm_head_to_fp32=True, and {type(inner).__name__}'s head is one the packed path scores "
                f"through the model's own logits ({self._why[id(inner)]}), which it cannot project in float32 outside "
                "autocast as TRL does. Set cast_lm_head_to_fp32=False, or keep lm_head out of the PEFT adapter "
                "(modules_to_save)."
            )
        return dataclasses.replace(head, float32=True) if head is not None and self.float32 else head
