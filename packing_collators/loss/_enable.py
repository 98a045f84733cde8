"""enable_chunked_loss(model): a stock Trainer (or any loop) gets the loss without the full logits, in one line.

    enable_chunked_loss(model)                                 once, before the Trainer is built
    model.train(); model(**batch, labels=..., num_items_in_batch=n)
      -> loss = chunked: sum over target tokens / n (or their mean) + aux_coef * aux_loss; logits (B, T, 0)
    model.eval();  model(**batch, labels=...)                 the model's own forward: logits for compute_metrics
                                                              (eval_logits=False: the chunked loss there too)

``model.forward`` becomes a method bound to the model itself (so ``copy.deepcopy`` and PEFT's wrapping
carry it), with the model class's own signature (so the Trainer still passes ``num_items_in_batch``).
The loss is the model's own loss (the stock Trainer's numbers: ``num_items_in_batch`` when the Trainer
gives it, else the mean), a chunk of tokens at a time (``_forward.py``); a call without labels, or
where the head is not one the chunked loss can compute (LoRA on ``lm_head``), runs the model's own
forward. Cost: one check forward over 16 tokens when enabled; then nothing per call.
"""

from __future__ import annotations

import functools
import inspect
import logging
import types

import torch

from .._model_unwrap import unwrap_model
from ..batch import shifted_targets, target_count
from ._forward import add_aux_loss, chunked_forward
from ._head import check_output_head, output_head

__all__ = ["enable_chunked_loss"]

logger = logging.getLogger(__name__)

_EVAL_LOGITS = "_packing_chunked_loss_eval_logits"


def _materialized(model) -> bool:
    """Whether the weights are real tensors a forward can run on (not meta, not DeepSpeed ZeRO-3 shards)."""
    return all(p.device.type != "meta" and not hasattr(p, "ds_numel") for p in model.parameters())


def enable_chunked_loss(model, *, eval_logits: bool = True):
    """Make ``model(**batch)`` compute its training loss a chunk of tokens at a time; returns ``model``.

    For a stock ``transformers.Trainer`` (with :class:`FlatteningCollator`) or a loop of your own: in
    training mode a call with ``labels`` (or ``shift_labels``) returns the model's own loss (``sum /
    num_items_in_batch`` when given, else the mean, plus an MoE model's ``aux_loss``), computed from the
    last hidden states at most 4,096 tokens at a time, and empty ``(B, T, 0)`` logits: no ``T x V``
    logits, no float32 copy. In eval mode the model's own forward runs (``compute_metrics`` gets its
    logits) unless ``eval_logits=False``. The model's head is checked once, here (a model whose head or
    loss does something the chunked loss does not is refused, with what differs). ``PackingTrainer`` does
    this itself (``loss_implementation``); TRL >= 1.16's ``SFTTrainer`` has a fused head of its own.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from packing_collators import FlatteningCollator
    >>> config = LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    ...                      intermediate_size=16)
    >>> model = LlamaForCausalLM(config)
    >>> batch = FlatteningCollator()([{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11]}])
    >>> full = model(**batch).loss
    >>> out = enable_chunked_loss(model)(**batch)
    >>> tuple(out.logits.shape), bool(torch.allclose(out.loss, full))
    ((1, 7, 0), True)
    """
    inner = unwrap_model(model)
    head, why = output_head(inner)
    if head is None:
        raise ValueError(f"enable_chunked_loss: {why}; train with the model's own loss (the full logits).")
    if _materialized(inner):
        why = check_output_head(inner, head)
        if why:
            raise ValueError(f"enable_chunked_loss({type(inner).__name__}): {why}. Train with its own loss.")
    else:
        logger.info("enable_chunked_loss: the weights are not materialized (meta or ZeRO-3 shards): head not checked")
    setattr(inner, _EVAL_LOGITS, eval_logits)
    if not isinstance(inner.__dict__.get("forward"), types.MethodType):  # once: calling it again changes nothing
        forward = functools.wraps(type(inner).forward)(_chunked_loss_forward)
        inner.forward = types.MethodType(forward, inner)
    return model


def _chunked_loss_forward(self, *args, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
    """The model's forward, with its training loss computed a chunk of tokens at a time (see enable_chunked_loss)."""
    own = functools.partial(type(self).forward, self)
    given = {k: v for k, v in (("labels", labels), ("shift_labels", shift_labels)) if v is not None}
    chunked = bool(given) and (self.training or not getattr(self, _EVAL_LOGITS, True))
    head = output_head(self)[0] if chunked else None
    if head is None:
        extra = dict(given) if num_items_in_batch is None else {**given, "num_items_in_batch": num_items_in_batch}
        return own(*args, **kwargs, **extra)
    if args:  # the arguments given by position, by their names in the model's signature
        kwargs.update(inspect.signature(type(self).forward).bind_partial(self, *args).arguments)
        kwargs.pop("self", None)
    as_tuple = kwargs.get("return_dict") is False  # the caller's choice; the chunked loss reads the outputs by name
    kwargs["return_dict"] = True
    targets = shifted_targets(given)
    count = num_items_in_batch if num_items_in_batch is not None else target_count(given)
    weights = torch.ones(targets.shape, dtype=torch.float32, device=targets.device)
    weights = weights / torch.as_tensor(count, device=targets.device, dtype=torch.float32).clamp(min=1)
    loss, outputs = chunked_forward(own, kwargs, head, targets, weights)
    loss = add_aux_loss(loss, outputs, head)
    result = type(outputs)(**{"loss": loss, **{k: v for k, v in outputs.items() if k != "loss"}})
    return result.to_tuple() if as_tuple else result
