"""PackingTrainer's loss without the full logits: the stock loss's numbers, a chunk of tokens at a time.

    compute_loss(model, inputs, num_items_in_batch)
      the model's head checked once (check_output_head)    else: the stock full-logit loss, the reason logged
      targets  = inputs' labels shifted (or shift_labels, a sequence shard's)
      weights  = 1 / num_items_in_batch per target token         loss_normalization="token" (the stock loss)
                 each example's 1 / (its targets) / examples     loss_normalization="sequence"
      loss     = chunked_forward(model, inputs, weights) + router_aux_loss_coef * aux_loss
                 * the Trainer's scale (ranks, and accumulation steps where the Trainer would divide)

The full-logit loss holds ``T x V`` logits, then a float32 copy of them (16k tokens at a 152k
vocabulary: 5 GB + 10 GB); this holds one chunk of at most 4,096 tokens (``packing_collators.loss``).
Kept on the full logits, with the reason logged: ``loss_implementation="full"``, a label smoother,
a ``compute_loss_func``, Liger's own fused loss, ``torch_compile=True`` where the model is compiled
whole (FSDP version 1, DeepSpeed, a hybrid: the target selection would break the graph; elsewhere only the
layers are, ``compile_layers``), a head the check refuses; and evaluation that hands
``compute_metrics`` its logits.
Cost: one forward over 16 tokens to check the head, once per model.
"""

from __future__ import annotations

import logging

import torch

from .._model_unwrap import probe_module, unwrap_model
from .._validation import validate_choice
from ..batch import IGNORE_INDEX, shifted_targets
from ..loss import LossImplementation, add_aux_loss, checked_head, chunked_forward
from ._liger import liger_forward

__all__ = ["HeadLoss", "LossImplementation", "why_full_logits"]

logger = logging.getLogger(__name__)

def why_full_logits(trainer) -> str:
    """Why the trainer's set-up needs the full logits ("" when it does not)."""
    args = trainer.args
    if getattr(trainer, "label_smoother", None) is not None:
        return f"label_smoothing_factor={args.label_smoothing_factor} smooths the full logits"
    if trainer.compute_loss_func is not None:
        return "compute_loss_func is given the model's logits"
    if liger_forward(trainer.model) is not None:
        return "Liger's fused loss replaces the model's forward (it never forms the logits either)"
    whole = getattr(getattr(trainer, "_compile", None), "whole_model", None)
    if getattr(args, "torch_compile", False) and whole != "":
        why = f" ({whole})" if whole else ""
        return f"torch_compile=True compiles the whole model{why}: selecting the target tokens would break its graph"
    return ""


class HeadLoss:
    """Which loss a trainer computes, decided once per model: chunked (its head checked) or the full logits."""

    def __init__(self, implementation: LossImplementation) -> None:
        validate_choice("loss_implementation", implementation, LossImplementation)
        self.implementation = implementation
        self.heads: dict[int, object] = {}  # id(model) -> OutputHead, or None: the full logits

    def head(self, trainer, model, inputs):
        """The model's checked :class:`OutputHead`, or None for the full-logit loss (logged once per model)."""
        inner = unwrap_model(model)
        if id(inner) in self.heads:
            return self.heads[id(inner)]
        why = why_full_logits(trainer) if self.implementation != "full" else ""
        if why and self.implementation == "chunked":
            raise ValueError(f"loss_implementation='chunked' cannot be used here: {why}.")
        head = None
        if not why:
            head, why = _checked(model, self.implementation)
        if head is None and self.implementation == "auto":
            logger.warning("PackingTrainer: the loss uses the full logits (%s).", why)
        elif head is not None:
            logger.info("PackingTrainer: the loss is computed a chunk of tokens at a time (%s checked)", type(inner).__name__)
        self.heads[id(inner)] = head
        return head

    def compute(self, trainer, model, inputs: dict, head, num_items_in_batch):
        """(the micro-batch's loss as the stock Trainer would scale it, the model's outputs without logits)."""
        targets = shifted_targets(inputs)
        if trainer.loss_normalization == "sequence" and model.training:
            from ._sequence_loss import sequence_target_weights

            weights, scale = sequence_target_weights(trainer, inputs, num_items_in_batch)
        else:
            weights, scale = _token_weights(trainer, targets, num_items_in_batch)
        loss, outputs = chunked_forward(model, inputs, head, targets, weights)
        return add_aux_loss(loss * scale, outputs, head, scale), outputs


def _token_weights(trainer, targets: torch.Tensor, num_items_in_batch):
    """1 / (the step's target tokens) per token and the Trainer's scale over ranks, as Trainer.compute_loss does."""
    args = trainer.args
    counted = num_items_in_batch is not None and trainer.model_accepts_loss_kwargs
    count = num_items_in_batch if counted else (targets != IGNORE_INDEX).sum()
    denominator = torch.as_tensor(count, device=targets.device, dtype=torch.float32).clamp(min=1)
    weights = torch.ones(targets.shape, dtype=torch.float32, device=targets.device) / denominator
    scale = 1.0
    if args.average_tokens_across_devices and counted:
        tp = trainer.get_tp_size() if hasattr(trainer, "get_tp_size") else 1
        scale = float(trainer.accelerator.num_processes // tp) if args.n_gpu <= 1 else float(args.n_gpu)
    return weights, scale


def _checked(model, implementation):
    """The model's checked head, the check run through the module the probe runs (every rank does, at its first loss)."""
    from ..parallel import inner_attention

    module = probe_module(model)
    with inner_attention(module):  # under sequence parallelism: this rank alone, no collective
        return checked_head(unwrap_model(model), implementation, probe=module)
