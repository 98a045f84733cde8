"""A batch with nothing to train: every label -100. The collators warn once each, naming its size.

    examples     [a b c] [d e]
    labels       [-100 -100 -100 -100 -100]     <- no target: the loss is 0.0 and the step learns nothing

An example's first label is always -100 (nothing before it predicts it); a batch whose other labels
are -100 too came so from the data: a completion-only mask over whole examples, answers truncated
away by ``max_length``, labels copied from the wrong column. Training on goes on (a few such
batches can be harmless), but never silently. Cost: one comparison over the batch's labels.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["NoTargetWarning"]

IGNORE_INDEX = -100  # transformers' cross-entropy ignore_index


class NoTargetWarning:
    """Warn, the first time only, that a collated batch has no label to train.

    >>> once = NoTargetWarning("FlatteningCollator")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     once.check(np.array([[-100, -100, -100, -100, -100]]), examples=2, tokens=5)
    ...     once.check(np.array([[-100, -100]]), examples=1, tokens=2)
    >>> [str(w.message)[:108] for w in caught]
    ['FlatteningCollator: a batch of 2 examples (5 tokens) has no label to train: every label is -100, so its loss']
    """

    def __init__(self, collator: str, label_pad_id: int = IGNORE_INDEX) -> None:
        self.collator = collator
        self.label_pad_id = label_pad_id
        self.warned = False

    def check(self, labels: np.ndarray, *, examples: int, tokens: int) -> None:
        """Warn if no label of ``labels`` is a target (and no batch was warned about before)."""
        if self.warned or ((labels != IGNORE_INDEX) & (labels != self.label_pad_id)).any():
            return
        self.warned = True
        warnings.warn(
            f"{self.collator}: a batch of {examples} example{'s' if examples != 1 else ''} ({tokens} tokens) has no "
            "label to train: every label is -100, so its loss is 0.0 and the step learns nothing from it. Each "
            "example's first label is always -100; the others came so from the data: check the labels (a "
            "completion-only mask over whole examples, answers truncated away by max_length, labels from the "
            "wrong column). Warned once per collator; later batches like it are not.",
            UserWarning,
            stacklevel=3,
        )
