"""What the Trainer divides a step's loss by, and the models whose padded count holds a token never scored.

transformers' Trainer counts a step's targets for ``num_items_in_batch`` as ``labels[..., 1:] != -100`` where the
model's class declares the causal-LM loss (``loss_type``), else as ``labels != -100``::

    padded, unshifted count   [a b c], [d e]      labels a..e: 5 counted, 3 scored (b, c, e)
    packed (any model)        [-100 b c -100 e]   3 counted: each example's first label is -100 in the row

A class without a declared loss type (GPT-2, CTRL, OpenAI-GPT, ...) still shifts its labels (transformers
falls back to the causal-LM loss), so padded training there divides the scored tokens' loss by more tokens than it
scores: the packed loss is the mean over the targets (as TRL's ``padding_free``), the padded one that times
``(targets) / (targets + examples whose first token has a label)``. Said once, when training begins.
Cost: one dictionary lookup.
"""

from __future__ import annotations

import logging

__all__ = ["counts_first_labels", "warn_unshifted_count"]

logger = logging.getLogger(__name__)


def counts_first_labels(model) -> bool:
    """Whether transformers' Trainer counts ``model``'s labels unshifted (no causal-LM ``loss_type`` declared).

    >>> from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    >>> counts_first_labels(GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=16)))
    True
    >>> counts_first_labels(LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
    ...                                                   num_attention_heads=2, intermediate_size=8)))
    False
    """
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    except ImportError:  # pragma: no cover - transformers without its loss registry
        return False
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    return LOSS_MAPPING.get(getattr(model, "loss_type", None)) is not ForCausalLMLoss


def warn_unshifted_count(model, who: str) -> None:
    """Say, for a model whose padded count holds each example's first label, what the packed loss is instead."""
    if counts_first_labels(model):
        logger.warning(
            "%s: %s declares no causal-LM loss_type, so transformers' Trainer counts its labels unshifted: on padded "
            "batches each example's first label (never a target) is counted in num_items_in_batch. Packed rows mark "
            "it -100, so this run's loss is the mean over the scored tokens (as TRL's padding_free), while padded "
            "training of the same examples logs targets / (targets + examples with a first label) of it.",
            who,
            type(model).__name__,
        )
