"""Predictions of flat rows, one row per example: what ``predict()`` and ``compute_metrics`` get.

    eval batch      [a a a | b b | c c c c | pad pad]       cu_seq_lens_q [0, 3, 5, 9, 11]  (pad_to_multiple_of)
    collator        + packing_example_count = 3              the examples collated, counted where they are known
    predictions     [[a a a . .]                             (examples, longest, ...) padded with -100; the
                     [b b . . .]                             padding segment after the last example is no row
                     [c c c c .]]
    inputs          the same layout, for ``include_for_metrics=["inputs"]``

The collator's padding is a segment of its own that no shape tells apart from an example, so the
eval and test dataloaders count the examples each batch holds (``ExampleCount``, a key the
prediction step removes before the model sees the batch). Cost: a tensor slice per example of
each evaluated batch.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..batch import CU_SEQ_LENS_Q, read_layout

__all__ = ["EXAMPLE_COUNT", "ExampleCount", "examples_counted", "is_flat_row", "per_example", "per_example_predictions"]

EXAMPLE_COUNT = "packing_example_count"


class ExampleCount:
    """``collator``'s batch, and how many examples it holds (a pre-packed row's ``seq_lengths`` each count)."""

    def __init__(self, collator) -> None:
        self.collator = collator

    def __call__(self, features: list) -> dict:
        batch = self.collator(features)
        batch[EXAMPLE_COUNT] = sum(
            len(f["seq_lengths"]) if isinstance(f, dict) and f.get("seq_lengths") is not None else 1 for f in features
        )
        return batch


@contextlib.contextmanager
def examples_counted(trainer):
    """While a dataloader is built: ``trainer.data_collator`` counts the examples of each batch."""
    collator = trainer.data_collator
    if collator is not None and not isinstance(collator, ExampleCount):
        trainer.data_collator = ExampleCount(collator)
    try:
        yield
    finally:
        trainer.data_collator = collator


def per_example(tensor, cu_seq_lens: list[int], count: int | None = None):
    """(1, T, ...) -> (n, longest, ...): each of the first ``count`` examples of a flat row (all its segments
    by default) in a row of its own, padded with -100."""
    import torch

    if tensor is None or not hasattr(tensor, "dim") or tensor.dim() < 2 or tensor.shape[0] != 1:
        return tensor
    cu = cu_seq_lens
    pieces = [tensor[0, start:end] for start, end in zip(cu[:-1], cu[1:]) if end > start][:count]
    return torch.nn.utils.rnn.pad_sequence(pieces, batch_first=True, padding_value=-100)


def per_example_predictions(inputs: dict, logits: Any, labels, count: int | None, main_input: str):
    """``logits`` and ``labels`` of a flat row as one row per example; ``inputs[main_input]`` too, in place
    (the evaluation loop reads it after the prediction step, for ``include_for_metrics=["inputs"]``)."""
    cu = read_layout(inputs).cu_seq_lens.tolist()
    if isinstance(logits, (tuple, list)):
        logits = type(logits)(per_example(x, cu, count) for x in logits)
    else:
        logits = per_example(logits, cu, count)
    if main_input in inputs:
        inputs[main_input] = per_example(inputs[main_input], cu, count)
    return logits, per_example(labels, cu, count)


def is_flat_row(inputs: dict) -> bool:
    """Whether a batch is flat rows laid out by ``cu_seq_lens_q`` (what :func:`per_example_predictions` splits)."""
    return inputs.get(CU_SEQ_LENS_Q) is not None
