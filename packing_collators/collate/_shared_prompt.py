"""Groups of sequences sharing a prompt -> one packed row, each prompt once (``batch.SharedPromptLayout``).

    groups [[P C1, P C2], [Q D1, Q D2, Q D3]]  -> shared_prompt_layout (numpy)  -> tensors:
    input_ids, position_ids (1, T); cu_seq_lens_q/k, max_length_q/k; kv_index (Tk,), q_index (T,);
    keys_labels, token_sequence (1, Tk); use_cache False

and the unshared row of the same sequences with its ``token_sequence`` (``flat_sequences_batch``), so a per-sequence
loss reads either layout one way. DPO collates its pairs as groups of two, GRPO a prompt's G completions.
Cost: the layout's concatenations, one tensor per key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..batch import KEYS_LABELS, KV_INDEX, Q_INDEX, TOKEN_SEQUENCE, shared_prompt_layout, varlen_kwargs
from ._flattening import FlatteningCollator

__all__ = ["flat_sequences_batch", "shared_prompt_batch"]


def shared_prompt_batch(groups: Sequence[Sequence[Mapping]]) -> dict:
    """The packed row of ``groups`` (each a list of ``input_ids``/``labels`` sequences of one prompt), prompts shared.

    >>> a = {"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}
    >>> b = {"input_ids": [1, 2, 4, 5], "labels": [-100, -100, 4, 5]}
    >>> batch = shared_prompt_batch([[a, b]])
    >>> batch["input_ids"].tolist(), batch["position_ids"].tolist(), batch["kv_index"].tolist()
    ([[1, 2, 3, 4, 5]], [[0, 1, 2, 2, 3]], [0, 1, 2, 0, 1, 3, 4])
    >>> batch["cu_seq_lens_q"].tolist(), batch["cu_seq_lens_k"].tolist(), batch["q_index"].tolist()
    ([0, 3, 5], [0, 3, 7], [0, 1, 2, 5, 6])
    """
    import torch

    layout = shared_prompt_layout(groups)
    varlen = varlen_kwargs(layout.queries, layout.keys)
    return {
        "input_ids": torch.from_numpy(layout.input_ids)[None],
        "position_ids": torch.from_numpy(layout.position_ids)[None],
        **{key: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for key, v in varlen.items()},
        KV_INDEX: torch.from_numpy(layout.kv_index),
        Q_INDEX: torch.from_numpy(layout.q_index),
        KEYS_LABELS: torch.from_numpy(layout.keys_labels)[None],
        TOKEN_SEQUENCE: torch.from_numpy(layout.token_sequence)[None],
        "use_cache": False,
    }


def flat_sequences_batch(sequences: Sequence[Mapping]) -> dict:
    """``FlatteningCollator``'s row of ``sequences``, with each token's sequence (``token_sequence``).

    >>> batch = flat_sequences_batch([{"input_ids": [1, 2], "labels": [-100, 2]}, {"input_ids": [3], "labels": [3]}])
    >>> batch["input_ids"].tolist(), batch["token_sequence"].tolist()
    ([[1, 2, 3]], [[0, 0, 1]])
    """
    import torch

    collator = FlatteningCollator()
    collator._no_targets.warned = True  # a scorer's rows, not training data: all masked is TRL's choice (truncations)
    batch = collator(list(sequences))
    lengths = np.array([len(s["input_ids"]) for s in sequences], dtype=np.int64)
    batch[TOKEN_SEQUENCE] = torch.from_numpy(np.repeat(np.arange(len(sequences)), lengths))[None]
    return batch
