"""The callbacks PackingTrainer adds when training begins: the packing checks and FA4's warm-up.

    on_train_begin   PackingCheckCallback   first 4 examples (those that fit a bucket, under compile)
                                            -> collator -> check_packing_support + probe
                     _AttentionWarmUp       FlashAttention-4 kernels compiled for the layouts the plan reaches
    each new epoch   _AttentionWarmUp       the octaves that epoch's plan reaches first (PackingTrainer._packing_epoch)

Both read the train dataloader's own dataset and collator (no sampler is touched, so the
data order is unchanged) and run on every rank before the first step.
Cost: one collated batch of 4 examples and the probe's few forwards (``checks/_probe.py``), once.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from .._compat import attn_implementation
from .._rank_agreement import refuse_together
from .._model_unwrap import probe_module, text_config, unwrap_model
from ..attention import FA4_ATTENTION, FA4_MANY, attention_kind, run_warm_up, warm_up_layouts
from ..checks import (
    check_collated_features,
    check_packing_support,
    check_training_data,
    probe_packing,
    refuse_failed_probe,
    refuse_no_batches,
)
from ..loss import HEAD_CHECK_TOKENS
from ._autocast import training_autocast
from ._label_count import warn_unshifted_count
from ._launch import refuse_data_parallel, refuse_dispatched_rows
from ._neftune import refuse_row_scaled_neftune

try:
    from transformers import TrainerCallback
except ImportError as error:  # pragma: no cover - transformers is a dependency
    raise ImportError("PackingTrainer needs transformers (pip install transformers).") from error

__all__ = ["PackingCheckCallback", "add_packing_callbacks"]

logger = logging.getLogger(__name__)


def _probe_batch(dataset, collate_fn, count: int = 4):
    """The first ``count`` examples and their collated batch, without touching any sampler's RNG; under
    buckets (a compiled run's collator) only the first ones that fit the largest bucket together, as a
    training micro-batch does."""
    features = [dataset[i] for i in range(min(count, len(dataset)))]
    largest = _largest_bucket(collate_fn)
    if largest is not None:
        lengths = np.cumsum([len(f["input_ids"]) if isinstance(f, dict) else 0 for f in features])
        features = features[: max(1, int((lengths <= largest).sum()))]
    return features, collate_fn(features)


def _largest_bucket(collate_fn) -> int | None:
    """The largest row a collator pads to (``pad_to_buckets``), looking through the Trainer's column-removing
    wrapper; None without buckets."""
    for _ in range(3):
        buckets = getattr(getattr(collate_fn, "options", None), "pad_to_buckets", None)
        if buckets:
            return max(buckets)
        collate_fn = getattr(collate_fn, "data_collator", None)  # transformers' RemoveColumnsCollator
    return None


class PackingCheckCallback(TrainerCallback):
    """Check, when training begins, that packing keeps examples apart (for a stock ``Trainer``).

    It collates the train dataset's first examples with the dataloader's collator (no
    sampler is touched, so the data order is unchanged) and raises, before the first
    step, what :func:`check_packing_support` reports: the static checks on the model and
    on every row of that batch, a pre-packed dataset whose packing the collator drops, an
    empty dataset (or dataloader), a token id outside the model's input embedding, transformers' own
    NEFTune (its noise scaled by the packed row's length; ``PackingTrainer`` scales it per example),
    and (``probe=True``, the default) the live equivalence probe, run with the same
    collator under the Trainer's mixed precision on every rank. ``last_report`` keeps
    what the probe measured. ``PackingTrainer`` adds this callback itself. One process on several
    GPUs (``args.n_gpu > 1``: started without ``torchrun``, so the Trainer wraps the model in
    ``torch.nn.DataParallel``) is refused first, naming ``torchrun`` and ``CUDA_VISIBLE_DEVICES=0``.

    >>> PackingCheckCallback()
    PackingCheckCallback(probe=True)
    """

    def __init__(self, *, probe: bool = True, model_for_probe=None, collator_for_probe=None) -> None:
        self.probe = probe
        self.last_report = None
        self.seconds = None  # what on_train_begin took (the checks and the probe)
        self.model_for_probe = model_for_probe  # () -> the compiled model to probe, or None (PackingTrainer's)
        self.collator_for_probe = collator_for_probe  # () -> the probe's collator, or None: the dataloader's

    def __repr__(self) -> str:
        return f"PackingCheckCallback(probe={self.probe})"

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        started = time.perf_counter()
        try:
            device = next(unwrap_model(model).parameters()).device if model is not None else "cpu"
            refuse_together(lambda: self._check(args, model, train_dataloader), device, "PackingCheckCallback")
        finally:
            self.seconds = time.perf_counter() - started

    def _check(self, args, model, train_dataloader) -> None:
        refuse_data_parallel(args, "PackingCheckCallback")  # python train.py on several GPUs: DataParallel
        if model is None or train_dataloader is None:
            return
        refuse_dispatched_rows(train_dataloader, unwrap_model(model), "PackingCheckCallback")  # a stream, sliced
        warn_unshifted_count(unwrap_model(model), "PackingCheckCallback")  # GPT-2's padded count: one more per example
        refuse_row_scaled_neftune(model)  # the stock Trainer's NEFTune: noise per packed row (PackingTrainer's is not)
        dataset, collate_fn = train_dataloader.dataset, train_dataloader.collate_fn
        check_training_data(unwrap_model(model), dataset)
        refuse_no_batches(train_dataloader)
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__") or not len(dataset):
            check_packing_support(model, collator=collate_fn, probe=False)  # its batches may say use_cache=False
            return
        features, batch = _probe_batch(dataset, collate_fn)
        check_collated_features(features, batch)
        check_packing_support(model, batch, probe=False)
        if self.probe:
            prepacked = any(isinstance(f, dict) and f.get("seq_lengths") is not None for f in features)
            compiled = self.model_for_probe() if self.model_for_probe is not None else None
            collator = self.collator_for_probe() if self.collator_for_probe is not None else None
            self.last_report = probe_packing(
                probe_module(model) if compiled is None else compiled,
                collate_fn if collator is None else collator,
                prepacked=prepacked,
                autocast=training_autocast(args, model),
            )
            logger.info("%s", self.last_report.summary())
            refuse_failed_probe(
                self.last_report, attention_kind(attn_implementation(text_config(model)))
            )


class _AttentionWarmUp(TrainerCallback):
    """Compile FlashAttention-4's kernel variants when training begins, not inside the steps.

    FA4 compiles a kernel per configuration, and the configuration follows the batch (its
    longest sequence, more than 256 sequences): left alone, a run stalls seconds at the
    first batch of a new kind. The warm-up runs :func:`warm_up_attention`'s layouts up to the longest example
    the sampler can batch, in the octaves the epoch's planned micro-batches reach (where the plan is known; else
    from the octave of the shortest example, the many-sequence variant only where a micro-batch can hold that
    many), on every rank, before the first step; each later epoch, the octaves its plan reaches that none before
    did (:meth:`new_epoch`). The model runs once; the other layouts replay its FA4 calls alone. Other
    implementations need none.
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.seconds = None
        self._warmed: set[tuple[int, ...]] = set()  # the layouts run so far
        self._recording = None  # the model's FA4 calls, replayed in later epochs
        self._model = self._args = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            return
        if getattr(self.trainer, "is_deepspeed_enabled", False) and _runs_fa4(model):  # a backward outside the engine
            logger.info("PackingTrainer: under DeepSpeed FlashAttention-4 compiles its kernels in the first steps")
            return
        self._model, self._args = model, args
        self.seconds = self._warm_up()

    def new_epoch(self) -> None:
        """A new epoch's plan: warm up the octaves it reaches that earlier epochs did not (none: nothing runs)."""
        if self._model is not None:
            self._warm_up()

    def _warm_up(self) -> float | None:
        loader = self.trainer._train_loader
        reach = {}
        if loader is not None:
            reached = loader.batch_layouts()
            head = getattr(self.trainer, "_head_loss", None)
            if reached is not None and head is not None and head.implementation != "full":
                reached.append((HEAD_CHECK_TOKENS, 1))  # the loss head's check: one row, in the first step
            reach = {"shortest": loader.shortest_example, "most_sequences": loader.most_sequences, "reached": reached}
        seconds, self._recording, layouts = _warm_up_packed(
            self._model, self.trainer.longest_train_sequence, self._args, skip=self._warmed,
            recording=self._recording, **reach,
        )  # fmt: skip
        self._warmed |= {tuple(layout) for layout in layouts}
        return seconds


def _runs_fa4(model) -> bool:
    return attn_implementation(text_config(model)) in ("flash_attention_4", FA4_ATTENTION)


def warm_up_packed_attention(
    model, longest: int, args, *, shortest: int = 1, most_sequences: int | None = None, reached=None
) -> float | None:
    """Compile FlashAttention-4's kernel variants for rows up to ``longest`` tokens on ``model`` (under the
    autocast ``args`` train with), before the first step; the seconds it took, None where the model's attention
    compiles nothing (not FA4) or there is nothing to warm. Every trainer on packed rows calls it when training
    begins (PackingTrainer, PackingDPOTrainer, the RL trainers). ``shortest`` (the shortest example),
    ``most_sequences`` (the most a micro-batch holds) and ``reached`` (each planned micro-batch's longest sequence
    and sequences), where the trainer knows them, leave out the variants no batch reaches."""
    seconds, _, _ = _warm_up_packed(model, longest, args, shortest=shortest, most_sequences=most_sequences,
                                    reached=reached)  # fmt: skip
    return seconds


def _warm_up_packed(model, longest: int, args, *, shortest=1, most_sequences=None, reached=None, skip=(), recording=None):
    """:func:`warm_up_packed_attention`, but for the layouts in ``skip`` (already run), with ``recording`` (an earlier
    warm-up's FA4 calls: the model need not run again). Returns (seconds or None, the recording, the layouts run)."""
    if not longest or not _runs_fa4(model):
        return None, recording, []
    started = time.perf_counter()
    layouts = [layout for layout in warm_up_layouts(longest, shortest=shortest, most_sequences=most_sequences,
                                                    reached=reached) if tuple(layout) not in skip]  # fmt: skip
    if not layouts:
        return None, recording, []
    recording = run_warm_up(probe_module(model), layouts, autocast=training_autocast(args, model), recording=recording)
    seconds = time.perf_counter() - started
    reach = "the octaves the planned micro-batches reach" if reached is not None else f"from {min(shortest, longest)}"
    logger.info("%s: FlashAttention-4 kernels compiled for %d batch layouts (%s, up to %d tokens)%s, in %.1f s",
                type(unwrap_model(model)).__name__, len(layouts), reach, longest,
                f" (at most {most_sequences} sequences a batch: not the variant of over {FA4_MANY})"
                if most_sequences is not None and most_sequences <= FA4_MANY else "", seconds)  # fmt: skip
    return seconds, recording, layouts


def add_packing_callbacks(trainer, *, probe: bool, warm_up: bool, metrics: bool):
    """PackingTrainer's callbacks: the checks (or sequence parallelism's), compile, FA4 warm-up, metrics, and the
    clock of what they took before the first step. Returns (the warm-up, whose ``new_epoch`` runs at each epoch's
    start, or None; the :class:`StartupClock`)."""
    from ._compile import compiled_model
    from ._metrics import PackingMetricsCallback
    from ._startup import StartupClock

    mesh = trainer.sequence_parallel_mesh
    if mesh is not None:
        from ._sequence_parallel import SequenceParallelCheckCallback

        checks = SequenceParallelCheckCallback(mesh, probe=probe)
    else:
        checks = PackingCheckCallback(probe=probe, model_for_probe=lambda: compiled_model(trainer),
                                      collator_for_probe=trainer._compile.probe_collator)  # fmt: skip
    trainer.add_callback(checks)
    if trainer._compile.enabled:
        trainer.add_callback(trainer._compile)
    # under Ulysses, FA4 compiles at first use
    warming = _AttentionWarmUp(trainer) if warm_up and mesh is None else None
    if warming is not None:
        trainer.add_callback(warming)
    if metrics:
        PackingMetricsCallback().attach(trainer)
    clock = StartupClock(
        checks_and_probe=lambda: getattr(checks, "seconds", None),
        compile=lambda: trainer._compile.report.seconds if trainer._compile.report is not None else None,
        fa4_warm_up=lambda: warming.seconds if warming is not None else None,
    )
    trainer.add_callback(clock)
    return warming, clock
