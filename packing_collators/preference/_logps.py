"""Each sequence's log-probability of its completion, from one packed forward, a chunk of tokens at a time.

    batch (PreferenceCollator)   --model, head--> log p(target) at each target position (1, T)   (loss.log_prob_forward)
    pair_sequence                --shift-->       the sequence each target belongs to             (2B of them)
    logps[s] = sum of its targets' log-probabilities          chosen = logps[0::2], rejected = logps[1::2]

A target at position t is token t + 1 of the row (a causal LM predicts the next token), so it belongs to
token t + 1's sequence; a sequence's first token is never a target, so nothing crosses a boundary. In
the shared-prompt layout the positions are the keys' (``[P C | P R]``, ``pair_labels``), each reading the
hidden state of its row token (``kv_index``): the prompt's last token predicts both completions' first. With
``stats`` the same pass gives each target's entropy, mean logit and whether it is the top token (the
metrics TRL logs). Cost: the chunked log-probabilities (``packing_collators.loss``), one index_add.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import IGNORE_INDEX, shifted_targets
from ..loss import OutputHead, log_prob_forward
from ._collator import PAIR_KEYS

__all__ = ["PairLogProbs", "pair_log_probs"]


@dataclass
class PairLogProbs:
    """One forward's log-probabilities of a batch of pairs.

    Attributes:
        chosen, rejected: float32 (B,): each sequence's summed log-probability of its completion.
        per_token: float32 (1, T): log p(target) at each target position (0 elsewhere).
        sequence: int64 (1, T): the sequence (0..2B-1) each target position belongs to, -1 where none.
        stats: float32 (1, T) ``entropy``, ``mean_logits``, ``is_top1`` at the target positions (when asked for).
        outputs: the model's outputs (an MoE model's ``aux_loss``).
    """

    chosen: torch.Tensor
    rejected: torch.Tensor
    per_token: torch.Tensor
    sequence: torch.Tensor
    stats: dict
    outputs: object

    def completion_lengths(self) -> torch.Tensor:
        """int64 (2B,): target tokens per sequence (chosen, rejected interleaved)."""
        count = 2 * self.chosen.shape[0]
        where = self.sequence >= 0
        return torch.bincount(self.sequence[where], minlength=count)

    def positions(self) -> torch.Tensor:
        """int64 (1, T): each target's position in its completion, from 1 (0 where no target)."""
        where = self.sequence >= 0
        ones = where.long().reshape(-1)
        cumulative = torch.cumsum(ones, 0)
        lengths = self.completion_lengths()
        before = torch.cumsum(lengths, 0) - lengths  # targets of the sequences before each one (row order)
        flat = self.sequence.reshape(-1).clamp(min=0)
        return torch.where(where.reshape(-1), cumulative - before[flat], 0).reshape(self.sequence.shape)


def pair_log_probs(model, batch: dict, head: OutputHead | None, *, stats: bool = False) -> PairLogProbs:
    """The chosen and rejected sequences' completion log-probabilities of a :class:`PreferenceCollator` batch."""
    inputs = {key: value for key, value in batch.items() if key not in PAIR_KEYS}
    shared = "pair_labels" in batch  # the shared-prompt layout: targets over the keys' layout
    targets = shifted_targets({"labels": batch["pair_labels"] if shared else batch["labels"]})
    rows = batch["kv_index"].reshape(targets.shape) if shared else None
    found: dict | None = {} if stats else None
    per_token, outputs = log_prob_forward(model, inputs, head, targets, stats=found, rows=rows)
    owner = torch.nn.functional.pad(batch["pair_sequence"][:, 1:], (0, 1), value=-1).to(per_token.device)
    sequence = torch.where(targets.to(owner.device) != IGNORE_INDEX, owner, -1)
    count = 2 * int(batch["pair_count"])
    where = sequence >= 0
    sums = torch.zeros(count, dtype=per_token.dtype, device=per_token.device)
    sums = sums.index_add(0, sequence[where], per_token[where])
    return PairLogProbs(sums[0::2], sums[1::2], per_token, sequence, found or {}, outputs)
