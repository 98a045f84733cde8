"""Each sequence's log-probability of its targets, from one packed forward, a chunk of tokens at a time.

    batch (a row of sequences)   --model, head--> log p(target) at each target position (1, T)   (log_prob_forward)
    token_sequence               --shift-->       the sequence each target belongs to             (S of them)
    sums[s] = sum of sequence s's targets' log-probabilities

A target at position t is token t + 1 of the row (a causal LM predicts the next token), so it belongs to
token t + 1's sequence; a sequence's first token is never a target, so nothing crosses a boundary. In the
shared-prompt layout (``keys_labels``) the positions are the keys' (``[P C1 | P C2 | ...]``), each reading the
hidden state of its row token (``kv_index``): the prompt's last token predicts every completion's first. No
pair or group is assumed: DPO splits the sums into chosen and rejected, GRPO reads them per completion.
With ``stats`` the same pass gives each target's entropy, mean logit and whether it is the top token; with a
``temperature`` the log-probabilities are those of the logits divided by it (a sampler's). Cost: the chunked
log-probabilities (``_forward.py``), one index_add.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from ..batch import IGNORE_INDEX, KEYS_LABELS, KV_INDEX, SEQUENCE_KEYS, TOKEN_SEQUENCE, shifted_targets
from ._forward import log_prob_forward
from ._head import OutputHead

__all__ = ["SequenceLogProbs", "sequence_log_probs"]


@dataclass
class SequenceLogProbs:
    """One forward's log-probabilities of a row of sequences.

    Attributes:
        sums: float32 (S,): each sequence's summed log-probability of its targets.
        per_token: float32 (1, T'): log p(target) at each target position (0 elsewhere; T' the keys' layout).
        sequence: int64 (1, T'): the sequence (0..S-1) each target position belongs to, -1 where none.
        stats: float32 (1, T') ``entropy``, ``mean_logits``, ``is_top1`` at the target positions (when asked for).
        outputs: the model's outputs (an MoE model's ``aux_loss``).
    """

    sums: torch.Tensor
    per_token: torch.Tensor
    sequence: torch.Tensor
    stats: dict
    outputs: object

    def target_counts(self) -> torch.Tensor:
        """int64 (S,): target tokens per sequence."""
        where = self.sequence >= 0
        return torch.bincount(self.sequence[where], minlength=self.sums.shape[0])

    def positions(self) -> torch.Tensor:
        """int64 (1, T'): each target's place among its sequence's targets, from 1 (0 where no target)."""
        where = self.sequence >= 0
        cumulative = torch.cumsum(where.long().reshape(-1), 0)
        counts = self.target_counts()
        before = torch.cumsum(counts, 0) - counts  # targets of the sequences before each one (row order)
        flat = self.sequence.reshape(-1).clamp(min=0)
        return torch.where(where.reshape(-1), cumulative - before[flat], 0).reshape(self.sequence.shape)

    def per_sequence(self, values: torch.Tensor) -> torch.Tensor:
        """float32 (S,): each sequence's sum of ``values`` (shaped like ``per_token``) over its targets."""
        where = self.sequence >= 0
        return torch.zeros_like(self.sums).index_add(0, self.sequence[where], values.to(self.sums.device)[where])

    def weighted_sums(self, weight: torch.Tensor) -> torch.Tensor:
        """float32 (S,): each sequence's sum of ``weight * per_token`` over its targets."""
        return self.per_sequence(self.per_token * weight)


def sequence_log_probs(
    model, batch: dict, head: OutputHead | None, *, count: int, stats: bool = False, temperature: float = 1.0,
    bookkeeping: Collection[str] = SEQUENCE_KEYS,
) -> SequenceLogProbs:  # fmt: skip
    """The ``count`` sequences' log-probabilities of a batch with ``token_sequence`` (``collate.flat_sequences_batch``
    or ``collate.shared_prompt_batch``); ``bookkeeping``: the keys kept from the model's forward.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from packing_collators.collate import flat_sequences_batch, shared_prompt_batch
    >>> from packing_collators.loss import checked_head
    >>> _ = torch.manual_seed(0)
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                                      num_attention_heads=2, num_key_value_heads=2)).eval()
    >>> group = [{"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]}, {"input_ids": [1, 2, 5], "labels": [-100, -100, 5]}]
    >>> head, _ = checked_head(model)
    >>> flat = sequence_log_probs(model, flat_sequences_batch(group), head, count=2).sums
    >>> shared = sequence_log_probs(model, shared_prompt_batch([group]), head, count=2).sums
    >>> flat.shape, bool(torch.allclose(flat, shared, atol=1e-5))
    (torch.Size([2]), True)
    """
    inputs = {key: value for key, value in batch.items() if key not in bookkeeping}
    shared = KEYS_LABELS in batch  # the shared-prompt layout: targets over the keys' layout
    targets = shifted_targets({"labels": batch[KEYS_LABELS] if shared else batch["labels"]})
    rows = batch[KV_INDEX].reshape(targets.shape) if shared else None
    found: dict | None = {} if stats else None
    per_token, outputs = log_prob_forward(model, inputs, head, targets, stats=found, rows=rows, temperature=temperature)
    owner = torch.nn.functional.pad(batch[TOKEN_SEQUENCE][:, 1:], (0, 1), value=-1).to(per_token.device)
    sequence = torch.where(targets.to(owner.device) != IGNORE_INDEX, owner, -1)
    where = sequence >= 0
    sums = torch.zeros(count, dtype=per_token.dtype, device=per_token.device)
    sums = sums.index_add(0, sequence[where], per_token[where])
    return SequenceLogProbs(sums, per_token, sequence, found or {}, outputs)
