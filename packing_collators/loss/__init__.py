"""The language-model loss without the full logits: a chunk of tokens at a time, exact.

_chunked.py   weighted_cross_entropy, token_log_probs: the loss (or per-token log-probabilities)
              from the last hidden states and the output embedding, a chunk of tokens at a time
_head.py      output_head, check_output_head: the model's head and what follows it, checked on the model
_forward.py   chunked_forward, log_prob_forward: one forward whose head computes them, no logits returned
_sequences.py sequence_log_probs: each sequence's summed log-probability of a row of sequences (shared
              prompts or not), for losses over sequences (DPO's pairs, GRPO's groups)
_enable.py    enable_chunked_loss(model): the same for a stock Trainer or a loop of your own, in one line

The targets each position predicts are the packed batch's (``packing_collators.batch.shifted_targets``).
Built on torch, the batch's home and the top-level helpers; ``trainer/`` builds on it.
"""

from ._chunked import MAX_CHUNK_ROWS, LogitTransform, chunk_rows, token_log_probs, weighted_cross_entropy
from ._enable import enable_chunked_loss
from ._forward import add_aux_loss, chunked_forward, log_prob_forward, training_loss
from ._head import (
    HEAD_CHECK_TOKENS,
    CheckedHeads,
    LossImplementation,
    OutputHead,
    check_output_head,
    checked_head,
    head_call,
    output_head,
)
from ._sequences import SequenceLogProbs, sequence_log_probs

__all__ = [
    "CheckedHeads",
    "HEAD_CHECK_TOKENS",
    "MAX_CHUNK_ROWS",
    "LogitTransform",
    "LossImplementation",
    "OutputHead",
    "SequenceLogProbs",
    "add_aux_loss",
    "check_output_head",
    "checked_head",
    "chunk_rows",
    "chunked_forward",
    "enable_chunked_loss",
    "head_call",
    "log_prob_forward",
    "output_head",
    "sequence_log_probs",
    "training_loss",
    "token_log_probs",
    "weighted_cross_entropy",
]
