"""The static checks on one collated batch: is its packed layout one that the attention honours?

    [S1 S1 S1 S2 S2 S3 S3 S3]  position_ids [0 1 2 0 1 0 1 2]  cu_seq_lens_q [0 3 5 8]

must restart positions where cu_seq_lens says (the batch's rule read both ways gives the same
examples: ``packing_collators.batch``), carry no attention_mask beside a packed layout, and be one
row under flash attention. Cost: a comparison over the batch's position_ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..attention import attention_kind, own_backend
from ..batch import CU_SEQ_LENS_K, CU_SEQ_LENS_Q, segment_starts

__all__ = ["check_batch", "numpy_of"]


def numpy_of(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _restarts(positions: np.ndarray, attention_mask) -> bool:
    """Whether positions restart inside a row (between two real tokens, when there is a mask)."""
    restart = numpy_of(segment_starts({"position_ids": positions}, positions.shape))[:, 1:]
    if attention_mask is not None:
        mask = numpy_of(attention_mask).astype(bool).reshape(positions.shape)
        restart &= mask[:, 1:] & mask[:, :-1]
    return bool(restart.any())


def _check_cu_seq_lens(cu: np.ndarray, positions: np.ndarray, kind: str, implementation: str) -> None:
    """cu_seq_lens_q splits the batch's tokens, and position_ids restart where it says (for sdpa/eager/flex)."""
    if cu.ndim != 1 or cu[0] != 0 or cu[-1] != positions.size or np.any(np.diff(cu) < 0):
        raise ValueError(
            f"cu_seq_lens_q={cu.tolist()[:8]}... does not split the {positions.size} tokens of the batch "
            "(it must start at 0, never decrease and end at the token count)."
        )
    by_positions = segment_starts({"position_ids": positions}, positions.shape)
    by_cu_seq_lens = segment_starts({CU_SEQ_LENS_Q: cu}, positions.shape)
    if kind == "position_ids" and not bool((by_positions == by_cu_seq_lens).all()):
        raise ValueError(
            f"position_ids do not restart where cu_seq_lens_q says examples start, and {implementation!r} "
            "separates examples by position_ids only, so they would attend to each other. "
            "Build position_ids and cu_seq_lens together (FlatteningCollator does)."
        )


def check_batch(batch: Mapping[str, Any], implementation: str, config) -> None:
    kind = attention_kind(implementation)
    if batch.get("use_cache"):
        raise ValueError(
            "The batch sets use_cache=True; a cache switches off packed-sequence detection. Drop use_cache from the batch."
        )
    flat = CU_SEQ_LENS_Q in batch or CU_SEQ_LENS_K in batch
    positions = batch.get("position_ids")
    if positions is not None:
        positions = numpy_of(positions)
        if positions.ndim != 2 or (flat and positions.shape[0] != 1):
            raise ValueError(
                f"position_ids has shape {positions.shape}; a flattened batch has one row, (1, T). "
                "Use FlatteningCollator (and per_device_train_batch_size = examples per row)."
            )
        flat = flat or _restarts(positions, batch.get("attention_mask"))
    if not flat:
        return
    if batch.get("attention_mask") is not None:
        raise ValueError(
            "The batch is flattened (cu_seq_lens / restarting position_ids) and also has an attention_mask: "
            "transformers then ignores the packed boundaries for sdpa/eager/flex and unpads by the mask for flash, "
            "so examples attend to each other. Drop attention_mask from flattened batches (FlatteningCollator does)."
        )
    if positions is None:
        raise ValueError(
            "The batch is flattened (has cu_seq_lens) but has no position_ids: positions would run on across "
            "examples. Collate with FlatteningCollator, which returns position_ids restarting per example."
        )
    if CU_SEQ_LENS_Q in batch:
        _check_cu_seq_lens(numpy_of(batch[CU_SEQ_LENS_Q]).astype(np.int64), positions, kind, implementation)
    elif kind == "cu_seq_lens" and positions.shape[0] > 1:
        raise ValueError(
            f"The batch has {positions.shape[0]} rows whose position_ids restart (packed rows) and no cu_seq_lens_q/k, "
            f"and {implementation!r} keeps examples apart only in a one-row batch (it reads cu_seq_lens, or derives "
            "them from position_ids when there is one row): the examples of each row would attend to each other. "
            "Collate with PrePackedCollator(mode='flatten') (or FlatteningCollator); mode='pad' is for sdpa/eager/flex."
        )
    elif own_backend(implementation) is not None:
        raise ValueError(
            f"attn_implementation={implementation!r} needs cu_seq_lens_q/k and max_length_q/k in the batch; "
            "collate with FlatteningCollator."
        )
