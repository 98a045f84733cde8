"""The shared-prompt layout: each pair's prompt once in the row, twice on the keys' side.

    row (queries)   [ P C | R ]                 cu_seq_lens_q  [0, p + c, p + c + r]
    keys            [ P C | P R ]               cu_seq_lens_k  [0, p + c, p + c + p + r]
    kv_index        the row position of each key: [0 .. p+c-1, 0 .. p-1, p+c .. p+c+r-1]
    q_index         each row token's key position: P and C their first copy, R its own

A varlen kernel with the keys gathered by ``kv_index`` and causal masking aligned bottom-right (the
last query sees the last key) gives R's queries exactly P and R before them: the attention of the
unshared layout, with the prompt computed once. Layers that carry state along the sequence run on the
keys' layout (the prompt's state recomputed for R), attention under sdpa/eager gets the dense mask
``shared_mask`` folds from it. A pair whose two cut sequences do not start with the same prompt
(``keep_end`` truncation) is laid out unshared in the same row. Cost: numpy concatenations per batch.
"""

from __future__ import annotations

import numpy as np
import torch

from ..batch import CU_SEQ_LENS_K, KV_INDEX, Q_INDEX, segment_layout, varlen_kwargs

__all__ = ["SHARED_ATTENTION", "shared_batch", "shared_mask", "with_shared_mask"]

# the attention implementations that keep a shared prompt's layout: the keys gathered (varlen), or the dense mask
SHARED_ATTENTION = ("packing_varlen", "packing_fa4", "sdpa", "eager")


def _prompt_length(chosen: dict, rejected: dict) -> int:
    """The length of the prompt both sequences start with (their leading untrained tokens), 0 if they differ."""
    lengths = []
    for sequence in (chosen, rejected):
        labels = np.asarray(sequence["labels"])
        trained = np.nonzero(labels != -100)[0]
        lengths.append(int(trained[0]) if len(trained) else len(labels))
    p = lengths[0]
    same = p == lengths[1] and p > 0 and list(chosen["input_ids"][:p]) == list(rejected["input_ids"][:p])
    return p if same and p < min(len(chosen["input_ids"]), len(rejected["input_ids"])) else 0


def _no_first_target(labels: list[int]) -> list[int]:
    return [-100, *labels[1:]] if labels else labels


class _Layout:
    """The arrays of a shared batch, filled pair by pair."""

    def __init__(self) -> None:
        self.ids, self.positions, self.kv, self.q_index = [], [], [], []
        self.q_lengths, self.k_lengths, self.labels, self.sequence = [], [], [], []
        self.row = self.keys = 0

    def add(self, index: int, chosen: dict, rejected: dict) -> None:
        p = _prompt_length(chosen, rejected)
        c_ids, r_ids = list(chosen["input_ids"]), list(rejected["input_ids"])
        c, r = len(c_ids), len(r_ids)  # whole sequences (prompt included)
        if p:
            self.ids += c_ids + r_ids[p:]
            self.positions += list(range(c)) + list(range(p, r))
            self.kv += list(range(self.row, self.row + c)) + list(range(self.row, self.row + p))
            self.kv += list(range(self.row + c, self.row + c + r - p))
            self.q_index += list(range(self.keys, self.keys + c)) + list(range(self.keys + c + p, self.keys + c + r))
            self.q_lengths += [c, r - p]
        else:  # laid out unshared: two sequences, keys = queries
            self.ids += c_ids + r_ids
            self.positions += list(range(c)) + list(range(r))
            self.kv += list(range(self.row, self.row + c + r))
            self.q_index += list(range(self.keys, self.keys + c + r))
            self.q_lengths += [c, r]
        self.k_lengths += [c, r]
        self.labels += _no_first_target(list(chosen["labels"])) + _no_first_target(list(rejected["labels"]))
        self.sequence += [2 * index] * c + [2 * index + 1] * r
        self.row, self.keys = len(self.ids), self.keys + c + r


def shared_batch(sequences: list[dict]) -> dict:
    """The batch of ``sequences`` (chosen, rejected, chosen, ... as ``PreferenceCollator.sequences`` gives them).

    >>> chosen = {"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}
    >>> rejected = {"input_ids": [1, 2, 4, 5], "labels": [-100, -100, 4, 5]}
    >>> batch = shared_batch([chosen, rejected])
    >>> batch["input_ids"].tolist(), batch["position_ids"].tolist(), batch["kv_index"].tolist()
    ([[1, 2, 3, 4, 5]], [[0, 1, 2, 2, 3]], [0, 1, 2, 0, 1, 3, 4])
    >>> batch["cu_seq_lens_q"].tolist(), batch["cu_seq_lens_k"].tolist(), batch["q_index"].tolist()
    ([0, 3, 5], [0, 3, 7], [0, 1, 2, 5, 6])
    """
    layout = _Layout()
    for i in range(0, len(sequences), 2):
        layout.add(i // 2, sequences[i], sequences[i + 1])
    varlen = varlen_kwargs(segment_layout(layout.q_lengths), segment_layout(layout.k_lengths))
    return {
        "input_ids": torch.tensor([layout.ids], dtype=torch.int64),
        "position_ids": torch.tensor([layout.positions], dtype=torch.int64),
        **{key: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for key, v in varlen.items()},
        KV_INDEX: torch.tensor(layout.kv, dtype=torch.int64),
        Q_INDEX: torch.tensor(layout.q_index, dtype=torch.int64),
        "pair_labels": torch.tensor([layout.labels], dtype=torch.int64),
        "pair_sequence": torch.tensor([layout.sequence], dtype=torch.int64),
        "use_cache": False,
    }


def shared_mask(batch: dict) -> torch.Tensor:
    """bool (1, 1, T, T): which row tokens each row token may attend to in the shared layout (sdpa/eager).

    >>> chosen = {"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}
    >>> rejected = {"input_ids": [1, 2, 4], "labels": [-100, -100, 4]}
    >>> shared_mask(shared_batch([chosen, rejected]))[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
    """
    from ..models import keys_layout_mask

    return keys_layout_mask(batch[KV_INDEX], batch[Q_INDEX], batch[CU_SEQ_LENS_K])


def with_shared_mask(batch: dict, implementation: str, dtype) -> dict:
    """``batch`` with the dense ``attention_mask`` a position-based attention needs for the shared layout
    (sdpa: bool; eager: additive, in ``dtype``); a varlen kernel reads ``kv_index`` instead."""
    if KV_INDEX not in batch or implementation not in ("sdpa", "eager"):
        return batch
    mask = shared_mask(batch)
    if implementation == "eager":
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return {**batch, "attention_mask": mask}
