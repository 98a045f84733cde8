"""A batch of pairs' log-probabilities: the loss folder's per-sequence ones, read as (chosen, rejected).

    PreferenceCollator batch  --loss.sequence_log_probs-->  sums over 2B sequences (chosen, rejected interleaved)
                              --pair view-->                chosen = sums[0::2], rejected = sums[1::2]

The pass itself (targets, the shared layout's keys, the stats TRL logs) is ``loss/_sequences.py``'s, for any
number of sequences; only the pairing is DPO's. Cost: two strided views.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..loss import OutputHead, SequenceLogProbs, sequence_log_probs
from ._collator import PAIR_COUNT, PAIR_KEYS

__all__ = ["PairLogProbs", "pair_log_probs"]


@dataclass
class PairLogProbs(SequenceLogProbs):
    """:class:`~packing_collators.loss.SequenceLogProbs` of 2B sequences, pair i's chosen at 2i, its rejected at 2i + 1."""

    @property
    def chosen(self) -> torch.Tensor:
        """float32 (B,): each chosen completion's summed log-probability."""
        return self.sums[0::2]

    @property
    def rejected(self) -> torch.Tensor:
        """float32 (B,): each rejected completion's."""
        return self.sums[1::2]


def pair_log_probs(model, batch: dict, head: OutputHead | None, *, stats: bool = False) -> PairLogProbs:
    """The chosen and rejected sequences' completion log-probabilities of a :class:`PreferenceCollator` batch."""
    found = sequence_log_probs(model, batch, head, count=2 * int(batch[PAIR_COUNT]), stats=stats, bookkeeping=PAIR_KEYS)
    return PairLogProbs(found.sums, found.per_token, found.sequence, found.stats, found.outputs)
