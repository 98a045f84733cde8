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

__all__ = ["SHARED_ATTENTION", "shared_batch", "shared_mask", "sliding_windows", "with_shared_mask"]

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


def sliding_windows(config) -> tuple[dict[str, int | None] | None, int | None]:
    """(layer type -> window, the window of every layer): how ``config``'s attention layers limit how far back a
    token sees. With ``layer_types``, a mask per type: the window on ``sliding_attention`` layers (Gemma 2/3), or,
    where no layer is called sliding and ``sliding_window`` is set, on the ``full_attention`` ones (MiniMax, whose
    window is model-wide); else ``sliding_window`` for every layer (Mistral, Mixtral), or (None, None). The
    check before training measures the result on the longest pairs (``_checks.py``).

    >>> from transformers import Gemma2Config, MiniMaxConfig, MistralConfig, Qwen2Config
    >>> sliding_windows(Gemma2Config(sliding_window=8, num_hidden_layers=2))
    ({'sliding_attention': 8, 'full_attention': None}, None)
    >>> sliding_windows(MiniMaxConfig(sliding_window=8, num_hidden_layers=2))
    ({'full_attention': 8, 'linear_attention': None}, None)
    >>> sliding_windows(MistralConfig(sliding_window=8)), sliding_windows(Qwen2Config())
    ((None, 8), (None, None))
    """
    window = getattr(config, "sliding_window", None)
    if not window:
        return None, None
    kinds = list(dict.fromkeys(getattr(config, "layer_types", None) or []))
    windowed = "sliding_attention" if "sliding_attention" in kinds else "full_attention"
    per_type = {kind: int(window) if kind == windowed else None for kind in kinds}
    if len(kinds) <= 1:
        return None, (int(window) if not kinds or per_type[kinds[0]] else None)
    return per_type, None


def _windowed(mask: torch.Tensor, batch: dict, window: int | None) -> torch.Tensor:
    """``mask`` with each token seeing only the keys less than ``window`` positions back (transformers' sliding
    window: ``kv > q - window``), positions read from the shared layout (R continues its prompt's)."""
    if window is None:
        return mask
    positions = batch["position_ids"].reshape(-1).to(mask.device)
    return mask & (positions[None, :] > positions[:, None] - window)[None, None]


def with_shared_mask(batch: dict, implementation: str, dtype, config=None) -> dict:
    """``batch`` with the dense ``attention_mask`` a position-based attention needs for the shared layout
    (sdpa: bool; eager: additive, in ``dtype``); a varlen kernel reads ``kv_index`` instead. With a text
    ``config`` whose layers slide a window, the mask slides it too: one mask for every layer (Mistral), or a
    mask per layer type (Gemma 2/3 take ``attention_mask`` as that mapping)."""
    if KV_INDEX not in batch or implementation not in ("sdpa", "eager"):
        return batch
    mask = shared_mask(batch)
    per_type, every = sliding_windows(config) if config is not None else (None, None)

    def finish(found: torch.Tensor) -> torch.Tensor:
        if implementation == "sdpa":
            return found
        return torch.zeros(found.shape, dtype=dtype, device=found.device).masked_fill(~found, torch.finfo(dtype).min)

    if per_type is not None:
        return {**batch, "attention_mask": {kind: finish(_windowed(mask, batch, w)) for kind, w in per_type.items()}}
    return {**batch, "attention_mask": finish(_windowed(mask, batch, every))}
