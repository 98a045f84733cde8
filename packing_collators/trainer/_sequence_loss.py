"""A per-sequence loss: each example's mean token loss, averaged over the examples of the batch.

The token mean (the default, and what padding gives) weighs every target token alike, so
an example of 900 target tokens counts 9 times one of 100. The sequence mean weighs every
example alike: each of its target tokens gets ``1 / (its example's target tokens)``::

    labels   = [[-100, b, c, -100, e, -100, g, h, i]]      3 examples: 2, 1 and 3 targets
    weights  = [[ 0, 1/2, 1/2, 0,  1,   0, 1/3, 1/3, 1/3]]   float32 (B, T), aligned with labels
    loss     = sum(token_loss * weights) / 3                 3 = weights.sum() = examples

Examples are found by the batch's one rule (``packing_collators.batch``): ``cu_seq_lens_q`` of a
one-row batch, else where ``position_ids`` do not go up by one (a padded pack row), else one
example per row (a padded batch). Label 0 of every row is never a target (a causal LM shifts labels by
one), and an example with no target counts for nothing. The trade-off: a short example's
tokens weigh more than a long one's (each example counts once), which is what
``loss_normalization="sequence"`` asks for and what the token mean avoids.
Cost: one ``bincount`` over the batch's tokens; the loss reads the logits once in float32,
as transformers' own causal-LM loss does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ..batch import IGNORE_INDEX, segment_ids

__all__ = [
    "LossNormalization",
    "count_sequences",
    "sequence_loss_weights",
    "sequence_mean_loss",
    "sequence_target_weights",
]

LossNormalization = Literal["token", "sequence"]


def sequence_loss_weights(batch: Mapping[str, Any], *, ignore_index: int = IGNORE_INDEX):
    """Per-token weights that turn a summed token loss into a sum of per-example mean losses.

    ``batch`` is a collated batch (torch tensors) with ``labels`` and, for packed rows,
    ``cu_seq_lens_q`` or ``position_ids``. Returns float32 (B, T), aligned with ``labels``:
    ``1 / n`` on each of the ``n`` target tokens of an example, 0 elsewhere (and at column 0,
    which a causal LM never predicts). ``weights.sum()`` is the number of examples with a target.

    >>> from packing_collators import FlatteningCollator
    >>> batch = FlatteningCollator()([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, {"input_ids": [6, 7, 8, 9]}])
    >>> sequence_loss_weights(batch).tolist()
    [[0.0, 0.5, 0.5, 0.0, 1.0, 0.0, 0.3333333432674408, 0.3333333432674408, 0.3333333432674408]]
    >>> float(sequence_loss_weights(batch).sum())
    3.0
    """
    import torch

    segments, targets, counts = _target_counts(batch, ignore_index)
    per_token = counts.to(torch.float32).clamp(min=1).reciprocal()[segments]
    return torch.where(targets, per_token, torch.zeros((), dtype=torch.float32, device=per_token.device))


def _target_counts(batch: Mapping[str, Any], ignore_index: int = IGNORE_INDEX):
    """(segments (B, T), targets (B, T) bool, target tokens per example) of a collated batch."""
    import torch

    labels = batch.get("labels")
    if labels is None or not hasattr(labels, "dim") or labels.dim() != 2:
        raise ValueError(
            "The per-sequence loss needs batch['labels'] as a (batch, tokens) torch tensor, got "
            f"{type(labels).__name__}; collate with return_tensors='pt' (the default) and keep the labels."
        )
    segments = segment_ids(batch, tuple(labels.shape)).to(labels.device)
    targets = labels != ignore_index
    targets[:, 0] = False  # a causal LM's first token is never predicted
    counts = torch.bincount(segments[targets], minlength=int(segments.max()) + 1 if segments.numel() else 0)
    return segments, targets, counts


def sequence_mean_loss(logits, labels, weights, num_sequences=None, *, ignore_index: int = IGNORE_INDEX):
    """The causal-LM loss with each example counted once: ``sum(token_loss * weights) / num_sequences``.

    ``logits`` (B, T, V), ``labels`` (B, T) unshifted, ``weights`` from :func:`sequence_loss_weights`.
    ``num_sequences`` is the number of examples the loss averages over: by default this batch's
    (``weights.sum()``); with gradient accumulation or several ranks pass the count over all
    micro-batches of the optimizer step (and all ranks), so each example weighs the same
    wherever it lands. Equal to the mean over rows of a padded batch's per-row mean loss.

    >>> import torch
    >>> from packing_collators import FlatteningCollator
    >>> batch = FlatteningCollator()([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    >>> logits = torch.zeros(1, 5, 8)  # uniform over 8 tokens: every token's loss is log(8)
    >>> round(float(sequence_mean_loss(logits, batch["labels"], sequence_loss_weights(batch))), 4)
    2.0794
    """
    import torch

    vocab = logits.shape[-1]
    token_loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab).float(),
        labels[:, 1:].reshape(-1).to(logits.device),
        ignore_index=ignore_index,
        reduction="none",
    )
    weights = weights[:, 1:].reshape(-1).to(token_loss.device)
    if num_sequences is None:
        num_sequences = weights.sum()
    return (token_loss * weights).sum() / torch.as_tensor(num_sequences, device=token_loss.device).clamp(min=1)


def count_sequences(batch: Mapping[str, Any]) -> int:
    """Examples with at least one target token in ``batch``: the per-sequence loss's denominator.

    >>> from packing_collators import FlatteningCollator
    >>> count_sequences(FlatteningCollator()([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}]))  # [4] has no target
    1
    """
    return int((_target_counts(batch)[2] > 0).sum())


def global_sequence_count(trainer, batch_samples: list, device):
    """Examples with a target over an optimizer step's micro-batches, summed over ranks.

    The per-sequence twin of the Trainer's ``num_items_in_batch`` (target tokens over the
    same micro-batches, gathered over ranks): the denominator every micro-batch's loss
    shares, so the step's gradient is that of the mean over all its examples.
    """
    import torch

    count = torch.tensor(sum(count_sequences(batch) for batch in batch_samples), dtype=torch.float32, device=device)
    if trainer.args.world_size > 1:
        count = trainer.accelerator.gather(count.reshape(1)).sum()
    return count


def _trainer_divides_by_accumulation(trainer, num_items_in_batch) -> bool:
    """Whether ``Trainer.training_step`` divides the loss by the accumulation steps (transformers 5.17 to 5.24)."""
    scaled = getattr(trainer, "loss_is_scaled_for_ga", None)  # 5.24: a subclass may say so itself
    if scaled is None:
        scaled = (trainer.model_accepts_loss_kwargs and num_items_in_batch is not None) or (
            trainer.compute_loss_func is not None
        )
    return not scaled


def sequence_target_weights(trainer, inputs: dict, num_sequences):
    """float32 (B, T) weights aligned with the shifted targets (position t predicts label t + 1), each the
    token's share of the step's per-sequence loss, and the scale :func:`sequence_compute_loss` applies."""
    import torch

    weights = sequence_loss_weights(inputs)
    shifted = torch.nn.functional.pad(weights[:, 1:], (0, 1))
    if num_sequences is None:  # outside a training step: this batch's own per-sequence mean
        return shifted / weights.sum().clamp(min=1), 1.0
    shifted = shifted / torch.as_tensor(num_sequences, device=shifted.device, dtype=torch.float32).clamp(min=1)
    return shifted, _sequence_scale(trainer, num_sequences)


def _sequence_scale(trainer, num_sequences) -> float:
    """The processes (DDP, FSDP and DeepSpeed average over ranks) times the accumulation steps where the
    Trainer divides by them: what makes a step's gradient that of the per-sequence mean."""
    scale = float(trainer.accelerator.num_processes) if trainer.args.world_size > 1 else 1.0
    if _trainer_divides_by_accumulation(trainer, num_sequences):
        scale *= trainer.current_gradient_accumulation_steps
    return scale


def sequence_compute_loss(trainer, model, inputs: dict, return_outputs: bool, num_sequences):
    """A training micro-batch's share of the step's per-sequence loss (``loss_normalization="sequence"``).

    The model runs without labels (so it returns logits and computes no loss of its own);
    the loss is ``sum(token_loss * weights) / num_sequences`` with ``num_sequences`` the
    step's example count over ranks, times the number of processes (DDP, FSDP and DeepSpeed
    average gradients over ranks), and times the accumulation steps where the Trainer
    divides by them, so the step's gradient is exactly that of the per-sequence mean.
    """
    weights = sequence_loss_weights(inputs)
    labels = inputs["labels"]
    outputs = model(**{key: value for key, value in inputs.items() if key != "labels"})
    logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs[0]
    if num_sequences is None:  # called outside a training step: this batch's own per-sequence mean
        loss = sequence_mean_loss(logits, labels, weights)
        return (loss, outputs) if return_outputs else loss
    loss = sequence_mean_loss(logits, labels, weights, num_sequences) * _sequence_scale(trainer, num_sequences)
    return (loss, outputs) if return_outputs else loss


def check_sequence_setup(trainer) -> None:
    """Refuse, at construction, what ``loss_normalization="sequence"`` would silently replace."""
    if trainer.loss_normalization != "sequence":
        return
    if trainer.compute_loss_func is not None:
        raise ValueError(
            "loss_normalization='sequence' computes the training loss itself, so compute_loss_func would never be "
            "called. Pass one or the other (a compute_loss_func gets num_items_in_batch, the step's target tokens)."
        )
    if getattr(trainer.args, "label_smoothing_factor", 0):
        raise ValueError(
            f"loss_normalization='sequence' computes the training loss without label smoothing, so "
            f"label_smoothing_factor={trainer.args.label_smoothing_factor} would be ignored. Set it to 0, or "
            "keep loss_normalization='token'."
        )
