"""What each position of a batch predicts: the one reading of ``labels`` and ``shift_labels``.

    labels        [[-100, b, c, -100, e]]     a causal LM's labels, unshifted (the collators' -100 at each example's start)
    targets       [[   b, c, -100, e, -100]]  position t predicts labels[t + 1]: -100 at each example's last token
    shift_labels  a sequence shard's targets, fixed over the whole row before the cut: taken as they are

The loss (``loss/``), the trainer's target counts and the sequence shards read targets here.
Cost: one shifted copy of the labels.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._keys import IGNORE_INDEX, SHIFT_LABELS

__all__ = ["shifted_targets", "target_count"]


def shifted_targets(batch: Mapping):
    """int64 (B, T): the token each position predicts (``-100``: none), as transformers' causal-LM loss shifts.

    >>> import torch
    >>> shifted_targets({"labels": torch.tensor([[-100, 12, 13, -100, 22]])}).tolist()
    [[12, 13, -100, 22, -100]]
    """
    import torch

    shifted = batch.get(SHIFT_LABELS)
    if shifted is not None:
        return shifted
    labels = batch["labels"]
    return torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def target_count(batch: Mapping):
    """How many tokens of ``batch`` are predicted (a 0-dim tensor on its device).

    >>> import torch
    >>> int(target_count({"labels": torch.tensor([[-100, 12, 13, -100, 22]])}))
    3
    """
    return (shifted_targets(batch) != IGNORE_INDEX).sum()
