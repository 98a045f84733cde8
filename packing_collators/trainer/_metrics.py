"""``PackingMetricsCallback``: how well packing fills the batches, in the Trainer's own training logs.

Every training log line (console, TensorBoard, W&B, ``state.log_history``) gains five numbers::

    {'loss': 2.31, 'grad_norm': 1.9, 'learning_rate': 1e-05,
     'num_tokens': 1048576,          real input tokens trained so far, all ranks (TRL's name)
     'tokens_per_second': 41210.5,   real tokens / wall seconds since the previous log
     'padding_fraction': 0.0,        pad slots / all slots of the micro-batches since then
     'examples_per_step': 212.5,     examples per optimizer step (all ranks), averaged since then
     'packing_efficiency': 0.9812,   real tokens / (micro-batches x token budget); only with a budget
     'epoch': 0.12}

What is counted, per micro-batch (``T`` slots = ``input_ids.numel()``)::

    padded rows     [[a, b, c, pad], [d, e, pad, pad]]  attention_mask zeros are padding: T=8, real=5, examples=2
    flattened row   [[a, b, c, d, e]]  cu_seq_lens_q=[0, 3, 5]   no padding: T=5, real=5, examples=2

Rule: real tokens = slots - ``attention_mask`` zeros (all slots without a mask); examples = the
batch's examples as every reader counts them (``packing_collators.batch``: ``cu_seq_lens_q`` of one
row, else restarting ``position_ids``, else rows). ``FlatteningCollator(pad_to_multiple_of=m)``'s
padding is a segment of its own that no shape tells apart from an example: it counts as real
tokens and one example (under ``m`` tokens per micro-batch).

Design: the Trainer gives callbacks no batches and adds the reporters' callbacks before yours,
so the callback wraps two methods of the trainer instance: ``training_step`` counts each
micro-batch where the Trainer trains it (the main process, so ``dataloader_num_workers > 0``
works; counting inside the collator would count in the workers), and ``log`` adds the numbers to
the ``logs`` dict before the Trainer records and reports it. ``PackingTrainer`` has one itself; a
stock ``Trainer`` or TRL's ``SFTTrainer`` takes it the Trainer's own way::

    Trainer(..., callbacks=[PackingMetricsCallback()])

At ``on_train_begin`` the callback finds the trainer running it (the frame of the trainer method
that called the callback handler: the Trainer passes callbacks no reference to itself) and wires
itself in there; ``PackingMetricsCallback().attach(trainer)`` does the same at once, explicitly.

Cost: per micro-batch, Python arithmetic on shapes plus, for a batch with an ``attention_mask``,
one ``(mask == 0).sum()`` kept on the batch's device (no ``.item()``, no device sync); per log, one
4-number ``all_reduce`` (when ``torch.distributed`` is initialised) and one copy to the host.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from .._compat import caller_frame
from .._validation import validate_positive_int
from ..batch import padding_tail, segment_count
from ..collate import bucket_padding_id

try:
    from transformers import TrainerCallback
except ImportError as error:  # pragma: no cover - transformers is a dependency
    raise ImportError("PackingMetricsCallback needs transformers (pip install transformers).") from error

__all__ = ["PackingMetricsCallback"]


def _batch_counts(inputs, padding_id: int | None = None) -> tuple:
    """(slots, pad slots, examples) of one collated micro-batch; pad/examples may be 0-dim tensors.
    ``padding_id``: the collator pads rows to buckets with a segment of these tokens (counted as padding)."""
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    if ids is None or not hasattr(ids, "shape") or len(ids.shape) == 0:
        return 0, 0, 0
    mask = inputs.get("attention_mask")
    pad = (mask == 0).sum() if mask is not None else 0
    examples = segment_count(inputs)
    if mask is None and padding_id is not None:
        pad = padding_tail(inputs, padding_id)
        examples = examples - (pad > 0).long()
    slots = 1
    for size in ids.shape:
        slots *= int(size)
    return slots, pad, examples


def _trainer_running(callback):
    """The transformers Trainer whose callback handler is calling ``callback`` now, or None.

    The Trainer hands callbacks no reference to itself, so the call stack is searched for the
    trainer method that called the handler (its ``self``): a Trainer holding this very callback.
    """
    from transformers import Trainer

    frame = caller_frame(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer) and any(c is callback for c in candidate.callback_handler.callbacks):
            return candidate
        frame = frame.f_back
    return None


class PackingMetricsCallback(TrainerCallback):
    """Add ``num_tokens``, ``tokens_per_second``, ``padding_fraction``, ``examples_per_step`` and
    ``packing_efficiency`` to every training log: ``Trainer(..., callbacks=[PackingMetricsCallback()])``,
    or ``PackingMetricsCallback().attach(trainer)`` (see the module).

    Args:
        max_tokens_per_batch: the micro-batch token budget for ``packing_efficiency``. ``None``
            (default): the attached trainer's sampler's ``max_tokens_per_batch`` (PackingTrainer's),
            else ``packing_efficiency`` is left out.

    ``count(batch)`` adds one micro-batch; ``take(steps=, seconds=)`` returns the numbers since the
    previous ``take`` and starts a new window (what the attached trainer does at each log).

    >>> from packing_collators import FlatteningCollator
    >>> metrics = PackingMetricsCallback(max_tokens_per_batch=8)
    >>> metrics.count(FlatteningCollator()([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]))
    >>> metrics.take(steps=1, seconds=2.0)
    {'num_tokens': 5, 'tokens_per_second': 2.5, 'padding_fraction': 0.0, 'examples_per_step': 2.0, 'packing_efficiency': 0.625}
    >>> import torch
    >>> metrics.count({"input_ids": torch.ones(2, 4), "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])})
    >>> metrics.take(steps=1, seconds=1.0)
    {'num_tokens': 10, 'tokens_per_second': 5.0, 'padding_fraction': 0.375, 'examples_per_step': 2.0, 'packing_efficiency': 0.625}
    >>> PackingMetricsCallback(max_tokens_per_batch=0)
    Traceback (most recent call last):
    ...
    ValueError: max_tokens_per_batch must be a positive integer or None (the trainer's sampler's budget), got 0.
    """

    def __init__(self, *, max_tokens_per_batch: int | None = None) -> None:
        self.max_tokens_per_batch = validate_positive_int(
            "max_tokens_per_batch", max_tokens_per_batch, allow_none=True, none_means="the trainer's sampler's budget"
        )
        self.num_tokens = 0
        self.padding_id: int | None = None  # a bucket padding segment's token (set from the trainer's collator)
        self._window = [0, 0, 0, 0]  # slots, pad slots, examples, micro-batches (this rank, since the last log)
        self._trainer = None
        self._clock = self._logged_step = None

    def __repr__(self) -> str:
        return f"PackingMetricsCallback(max_tokens_per_batch={self.max_tokens_per_batch})"

    def attach(self, trainer):
        """Count ``trainer``'s micro-batches and add the numbers to its training logs; returns ``self``.

        What ``callbacks=[PackingMetricsCallback()]`` does when training begins, done now.
        """
        if self._trainer is trainer:
            return self
        if self._trainer is not None:
            raise ValueError(
                "This PackingMetricsCallback is attached to another trainer already; make one per trainer."
            )
        callbacks = trainer.callback_handler.callbacks
        if any(isinstance(c, PackingMetricsCallback) and c is not self for c in callbacks):
            raise ValueError(
                f"{type(trainer).__name__} already has a PackingMetricsCallback; give it only one "
                "(PackingTrainer has its own unless packing_metrics=False)."
            )
        step, log = trainer.training_step, trainer.log

        def training_step(model, inputs, *args, **kwargs):
            self.count(inputs)
            return step(model, inputs, *args, **kwargs)

        def log_with_metrics(logs, *args, **kwargs):
            if "loss" in logs and self._clock is not None:
                logs.update(self._take_for(trainer))
            return log(logs, *args, **kwargs)

        trainer.training_step, trainer.log = training_step, log_with_metrics
        self.pads_like(trainer.data_collator)
        if not any(c is self for c in callbacks):
            trainer.add_callback(self)
        self._trainer = trainer
        return self

    def pads_like(self, collator) -> None:
        """Count the bucket padding of ``collator`` (a FlatteningCollator with ``pad_to_buckets``) as padding."""
        self.padding_id = bucket_padding_id(collator)

    def count(self, inputs) -> None:
        """Add one collated micro-batch (shapes, and a mask sum left on its device)."""
        slots, pad, examples = _batch_counts(inputs, self.padding_id)
        # under sequence parallelism a group's ranks hold shards of one micro-batch: its tokens are summed,
        # its examples (the global cu_seq_lens) and the micro-batch itself counted once, by the first shard
        mesh = getattr(self._trainer, "sequence_parallel_mesh", None)
        once = 1 if mesh is None or mesh.sp_rank == 0 else 0
        self._window = [
            self._window[0] + slots,
            self._window[1] + pad,
            self._window[2] + examples * once,
            self._window[3] + once,
        ]

    def take(self, *, steps: int, seconds: float, device=None, budget: int | None = None) -> dict:
        """The metrics of the window since the previous ``take`` (summed over ranks), then a new window."""
        import torch

        totals = torch.stack(
            [torch.as_tensor(v).to(device=device, dtype=torch.int64).reshape(()) for v in self._window]
        )
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(totals)
        slots, pad, examples, micro_batches = totals.tolist()
        self._window = [0, 0, 0, 0]
        real = slots - pad
        self.num_tokens += real
        metrics = {
            "num_tokens": self.num_tokens,
            "tokens_per_second": round(real / seconds, 1) if seconds > 0 else 0.0,
            "padding_fraction": round(pad / slots, 4) if slots else 0.0,
            "examples_per_step": round(examples / steps, 4) if steps else 0.0,
        }
        budget = self.max_tokens_per_batch or budget
        if budget and micro_batches:
            metrics["packing_efficiency"] = round(real / (micro_batches * budget), 4)
        return metrics

    def _take_for(self, trainer) -> dict:
        sampler_budget = getattr(getattr(trainer, "_train_batch_sampler", None), "max_tokens_per_batch", None)
        now, step = time.perf_counter(), trainer.state.global_step
        metrics = self.take(
            steps=step - self._logged_step,
            seconds=now - self._clock,
            device=trainer.args.device,
            budget=sampler_budget if isinstance(sampler_budget, int) else None,
        )
        self._clock, self._logged_step = now, step
        return metrics

    def on_train_begin(self, args, state, control, **kwargs):
        if self._trainer is None:
            trainer = _trainer_running(self)
            if trainer is None:
                raise ValueError(
                    "PackingMetricsCallback could not find the Trainer calling it (it counts batches in the "
                    "trainer's training_step); attach it explicitly: PackingMetricsCallback().attach(trainer)."
                )
            self.attach(trainer)
        # On resume, go on from the last logged count (state.log_history comes from the checkpoint).
        logged = [entry["num_tokens"] for entry in state.log_history if "num_tokens" in entry]
        self.num_tokens = int(logged[-1]) if logged else 0
        self._window = [0, 0, 0, 0]
        self._clock, self._logged_step = time.perf_counter(), state.global_step
