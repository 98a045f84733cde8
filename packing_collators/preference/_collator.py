"""PreferenceCollator: a micro-batch of preference pairs as one packed row, each sequence its own example.

Two pairs ``(P1, C1, R1)`` and ``(P2, C2, R2)`` (prompt, chosen, rejected token ids)::

    input_ids      [ P1 C1 | P1 R1 | P2 C2 | P2 R2 ]               int64 (1, T)   FlatteningCollator's layout:
    labels         [ -100.. C1 | -100.. R1 | ... ]                 int64 (1, T)   positions restart per sequence,
    position_ids   [ 0 1 .. | 0 1 .. | ... ]                                      cu_seq_lens_q/k, max_length_q/k
    token_sequence [ 0  0  0 | 1  1  1 | 2 .. | 3 .. ]             int64 (1, T)   2i: pair i's chosen, 2i + 1: rejected
    pair_count     2                                               int
    pair_tokens    [ |P1 C1| + |P1 R1|, ... ]                      int64 (B,)     tokens a padded batch would hold
    pair_completion_tokens  [ |C1|, |R1|, |C2|, |R2| ] (as cut)     int64 (2B,)    TRL's completion_mask.sum(), which
                                                                                  counts a completion token that
                                                                                  starts its sequence (no target)
    pair_chosen_targets     the chosen completions' targets         int            what "sft" averages over
    ref_chosen_logps, ref_rejected_logps                           float32 (B,)   when the dataset has them

With ``share_prompt=True`` each pair's prompt is laid out once, and the rejected completion attends to it
through a key-side layout that repeats it (a varlen kernel's keys, or the dense mask under sdpa/eager)::

    input_ids      [ P1 C1 R1 | P2 C2 R2 ]                         queries: [P C] then [R], per pair
    position_ids   [ 0 .. p+c-1, p .. p+r-1 | ... ]                R continues the prompt's positions
    kv_index       [ P1 C1 P1 R1 | P2 C2 P2 R2 ] (row positions)   int64 (Tk,): the keys, the prompt twice
    q_index        each row token's place among the keys           int64 (T,)
    cu_seq_lens_q  [0, |P1 C1|, +|R1|, ...]   cu_seq_lens_k [0, |P1 C1|, +|P1 R1|, ...]   (bottom-right causal)
    keys_labels, token_sequence                                    over the keys' layout: [P C] and [P R] as
                                                                   the unshared row has them (no ``labels``)

Both layouts are the collate folder's for any number of completions per prompt (``flat_sequences_batch``,
``shared_prompt_batch``: a pair is a group of two).

Only completion tokens are targets (the prompt's labels are -100), as TRL's ``DataCollatorForPreference``
marks them with its ``completion_mask``; each sequence is cut to ``max_length`` the same way
(``truncation_mode="keep_start"`` or ``"keep_end"``). ``PAIR_KEYS`` (the ``pair_*`` keys, the reference
log-probabilities) and the sequence keys are the loss's bookkeeping: the trainer takes them out before the
model's forward. Examples without ``prompt_ids`` (plain sequences,
as the packing probe sends) are flattened as ``FlatteningCollator`` does. Cost: one concatenation per batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from ..batch import SEQUENCE_KEYS
from ..collate import FlatteningCollator, flat_sequences_batch, shared_prompt_batch

__all__ = ["PAIR_CHOSEN_TARGETS", "PAIR_COUNT", "PAIR_KEYS", "PreferenceCollator"]

PAIR_COUNT, PAIR_TOKENS, PAIR_COMPLETION_TOKENS = "pair_count", "pair_tokens", "pair_completion_tokens"
PAIR_CHOSEN_TARGETS = "pair_chosen_targets"
REFERENCE_KEYS = ("ref_chosen_logps", "ref_rejected_logps")  # precomputed, when the dataset has them
PAIR_KEYS = (*SEQUENCE_KEYS, PAIR_COUNT, PAIR_TOKENS, PAIR_COMPLETION_TOKENS, PAIR_CHOSEN_TARGETS,
             *REFERENCE_KEYS)  # never the model's input  # fmt: skip
Truncation = Literal["keep_start", "keep_end"]


def _cut(ids: list[int], completion: list[int], max_length: int | None, mode: Truncation):
    """(ids, completion mask) of one sequence cut to ``max_length`` as TRL cuts it."""
    if max_length is None or len(ids) <= max_length:
        return ids, completion
    window = slice(None, max_length) if mode == "keep_start" else slice(-max_length, None)
    return ids[window], completion[window]


class PreferenceCollator:
    """Collate preference pairs (``prompt_ids``, ``chosen_ids``, ``rejected_ids``) into one packed row.

    Args:
        max_length: each prompt + completion sequence is cut to this many tokens (None: not cut).
        truncation_mode: ``"keep_start"`` (TRL's default) or ``"keep_end"``.

    >>> batch = PreferenceCollator()([{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5]}])
    >>> batch["input_ids"].tolist(), batch["labels"].tolist()
    ([[1, 2, 3, 1, 2, 4, 5]], [[-100, -100, 3, -100, -100, 4, 5]])
    >>> batch["token_sequence"].tolist(), batch["pair_count"], batch["pair_tokens"].tolist()
    ([[0, 0, 0, 1, 1, 1, 1]], 1, [7])
    """

    def __init__(
        self, *, max_length: int | None = None, truncation_mode: Truncation = "keep_start", share_prompt: bool = False
    ) -> None:
        if truncation_mode not in ("keep_start", "keep_end"):
            raise ValueError(f"truncation_mode={truncation_mode!r} is not supported; choose 'keep_start' or 'keep_end'.")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be a positive integer or None, got {max_length!r}.")
        self.max_length, self.truncation_mode, self.share_prompt = max_length, truncation_mode, share_prompt
        self._flatten = FlatteningCollator()

    def __repr__(self) -> str:
        return (
            f"PreferenceCollator(max_length={self.max_length}, truncation_mode={self.truncation_mode!r}, "
            f"share_prompt={self.share_prompt})"
        )

    def sequences(self, pair: Mapping[str, Any], index: int = 0) -> list[dict]:
        """The chosen and the rejected sequence of one pair, as examples (``input_ids``, ``labels``), cut."""
        for key in ("prompt_ids", "chosen_ids", "rejected_ids"):
            if key not in pair:
                raise ValueError(
                    f"Pair {index} has no {key!r} (its keys: {sorted(pair)}); a preference pair needs prompt_ids, "
                    "chosen_ids and rejected_ids (PackingDPOTrainer tokenizes prompt/chosen/rejected text for you)."
                )
        prompt = [int(t) for t in pair["prompt_ids"]]
        out = []
        for key in ("chosen_ids", "rejected_ids"):
            completion = [int(t) for t in pair[key]]
            ids, mask = _cut(prompt + completion, [0] * len(prompt) + [1] * len(completion), self.max_length,
                             self.truncation_mode)  # fmt: skip
            out.append({"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]})
        return out

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict:
        if features and "prompt_ids" not in features[0]:
            return self._flatten(features)  # plain sequences (the packing probe's): as FlatteningCollator does
        pairs = [self.sequences(pair, i) for i, pair in enumerate(features)]
        sequences = [s for pair in pairs for s in pair]
        batch = shared_prompt_batch(pairs) if self.share_prompt else flat_sequences_batch(sequences)
        return self._pair_extras(batch, features, sequences)

    def _pair_extras(self, batch: dict, features, sequences: list[dict]) -> dict:
        lengths = np.array([len(s["input_ids"]) for s in sequences], dtype=np.int64)
        batch[PAIR_COUNT] = len(features)
        batch[PAIR_TOKENS] = torch.from_numpy(lengths.reshape(-1, 2).sum(1))
        completion = [sum(label != -100 for label in s["labels"]) for s in sequences]  # a first token's included
        batch[PAIR_COMPLETION_TOKENS] = torch.tensor(completion, dtype=torch.int64)
        # the chosen completions' tokens with a target (a sequence's first token is none): what "sft" averages over
        batch[PAIR_CHOSEN_TARGETS] = sum(sum(label != -100 for label in s["labels"][1:]) for s in sequences[0::2])
        for key in REFERENCE_KEYS:
            if key in features[0]:
                batch[key] = torch.tensor([float(f[key]) for f in features], dtype=torch.float32)
        return batch
