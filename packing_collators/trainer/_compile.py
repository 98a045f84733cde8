"""Packed training under ``torch.compile``: a few shapes, every graph compiled before the first step.

A compiled model guards on what it was traced with, and a packed batch changes three things
every step: its length ``T``, its number of examples (``cu_seq_lens`` has ``n + 1`` entries)
and its longest example (``max_length_q/k``, Python ints). Left alone, that recompiles until
Dynamo's limit and then falls back to eager. Here::

    T                padded to a bucket (one by default: the token budget, which multipack
                     micro-batches nearly fill); the padding a segment of its own, never trained
    n, max_length    symbolic: the attention ops take them as SymInts (FA4's custom op,
                     torch's varlen op), so the graph does not depend on them

so a run compiles a bounded number of graphs, whatever its data. ``n`` and the max lengths are
traced as dynamic from the first compile (``torch.compiler.config.dynamic_sources``, see
:func:`symbolic_packing_sizes`; without it Dynamo's automatic dynamic shapes make them so at the
second batch, one compile more), and with several buckets one more graph takes ``T`` dynamic::

    warm-up batch    bucket  n  max      graphs so far
    1                16384   4  4096     1   (n, max_length symbolic)
    2                16384   7  10240    1
    training steps   16384   any any     1   (no recompile)

:func:`warm_up_compiled` runs those batches (forward and backward, as a training step does,
gradients cleared after) before the first step, so no timed step compiles; PackingTrainer
counts any later recompile and warns. The live probe runs the compiled model too, forward only on
its own shapes, and compiles graphs of its own: :class:`CompileReport` counts them apart
(``probe_graphs``), so ``graphs`` is the training graphs the table shows. Cost: the compiles themselves (seconds to a minute per
graph on a GPU), once, and the buckets' padding, reported as :class:`CompileReport`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from transformers import TrainerCallback

from .._compat import dynamo_counters, trainer_step_inputs
from .._model_unwrap import text_config
from ..batch import VARLEN_KEYS

__all__ = [
    "CompilePlan",
    "CompileReport",
    "CompileWarmUp",
    "compile_plan",
    "compile_trainer_layers",
    "bucketed_collator",
    "compile_buckets",
    "compiled_model",
    "graphs_compiled",
    "warm_up_compiled",
    "warm_up_lengths",
]

logger = logging.getLogger(__name__)


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (Dynamo's counters).

    >>> graphs_compiled() >= 0
    True
    """
    return int(dynamo_counters()["stats"]["unique_graphs"])


@dataclass
class CompileReport:
    """What compiling a packed run cost.

    Attributes:
        buckets: the row lengths micro-batches are padded to.
        padding_fraction: pad slots / all slots the buckets add over the epoch's plan.
        graphs: training graphs the warm-up compiled before the first step (one per run for one
            bucket where ``torch.compiler.config.dynamic_sources`` exists, else two).
        probe_graphs: the other graphs compiled before the first step: the live probe's forwards
            on the compiled model (its own shapes, no backward), counted apart from ``graphs``.
        seconds: wall time of the warm-up.
        recompiles: graphs compiled after the warm-up, during training (0 expected).
    """

    buckets: tuple[int, ...]
    padding_fraction: float
    graphs: int = 0
    seconds: float = 0.0
    recompiles: int = 0
    probe_graphs: int = 0

    def summary(self) -> str:
        """One line for a log.

        >>> CompileReport((16384,), 0.0071, graphs=1, seconds=41.5, probe_graphs=2).summary()
        'torch.compile: 1 training graph(s) compiled before the first step in 41.5 s (and 2 for the live probe); micro-batches padded to (16384,) tokens (padding 0.71% of slots); 0 recompiles since'
        """
        probe = f" (and {self.probe_graphs} for the live probe)" if self.probe_graphs else ""
        return (
            f"torch.compile: {self.graphs} training graph(s) compiled before the first step in {self.seconds:.1f} s"
            f"{probe}; micro-batches padded to {self.buckets} tokens (padding {100 * self.padding_fraction:.2f}% "
            f"of slots); {self.recompiles} recompiles since"
        )


def bucketed_collator(collator, buckets: tuple[int, ...]):
    """``collator`` padding to ``buckets``: a FlatteningCollator without buckets gets them; others stay.

    >>> from packing_collators import FlatteningCollator
    >>> bucketed_collator(FlatteningCollator(), (64,)).options.pad_to_buckets
    (64,)
    >>> bucketed_collator(FlatteningCollator(pad_to_buckets=[32]), (64,)).options.pad_to_buckets
    (32,)
    """
    from dataclasses import asdict

    from ..collate import FlatteningCollator

    if type(collator) is not FlatteningCollator or collator.options.pad_to_buckets is not None:
        return collator
    return FlatteningCollator(**{**asdict(collator.options), "pad_to_buckets": buckets})


def warm_up_lengths(bucket: int) -> list[list[int]]:
    """Two batches of example lengths for ``bucket``, each with another number of examples and another
    longest one (the padding segment included) than the other and than the probe's, so that the
    second compile makes both symbolic.

    >>> warm_up_lengths(1024)
    [[256, 256, 256], [64, 64, 64, 64, 64, 64]]
    """
    return [[max(1, bucket // 4)] * 3, [max(1, bucket // 16)] * 6]


def warm_up_compiled(step, collator, buckets: tuple[int, ...], *, vocab: int) -> tuple[float, int]:
    """Run ``step(batch)`` (one training forward and backward) on the batches that compile every graph.

    ``step`` takes a collated CPU batch; for each bucket, the batches of :func:`warm_up_lengths`
    are collated with ``collator`` (which pads them to the bucket). Returns (seconds, graphs compiled).

    >>> from packing_collators import FlatteningCollator
    >>> seen = []
    >>> warm_up_compiled(lambda b: seen.append(b["input_ids"].shape[1]), FlatteningCollator(pad_to_buckets=[64]),
    ...                  (64,), vocab=16)[1]
    0
    >>> seen
    [64, 64]
    """
    import torch

    started, graphs = time.perf_counter(), graphs_compiled()
    generator = torch.Generator().manual_seed(0)
    with symbolic_packing_sizes():
        for bucket in buckets:
            for lengths in warm_up_lengths(bucket):
                examples = [{"input_ids": torch.randint(0, vocab, (n,), generator=generator)} for n in lengths]
                step(collator(examples))
    return time.perf_counter() - started, graphs_compiled() - graphs


PACKING_SOURCES = r".*\['(" + "|".join(VARLEN_KEYS) + r")'\]"
"""The batch keys Dynamo should take as dynamic from the first trace (a ``dynamic_sources`` regex)."""


@contextlib.contextmanager
def symbolic_packing_sizes():
    """Trace ``cu_seq_lens_q/k`` and ``max_length_q/k`` as dynamic from the first compile on.

    Without it Dynamo compiles a static graph first and a dynamic one at the next batch (automatic
    dynamic shapes): one compile saved. Needs ``torch.compiler.config.dynamic_sources`` with regex
    entries; elsewhere a no-op (the second compile then happens in the warm-up).

    >>> with symbolic_packing_sizes():
    ...     pass
    """
    import torch

    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "dynamic_sources"):
        yield
        return
    sources = ",".join(filter(None, [config.dynamic_sources, PACKING_SOURCES]))
    with config.patch(dynamic_sources=sources):
        yield


def compile_buckets(budget: int) -> tuple[int, ...]:
    """PackingTrainer's buckets for a token budget: one, the budget (rounded up to 8), which multipack
    micro-batches nearly fill; the last micro-batches of an epoch pay more.

    >>> compile_buckets(16384)
    (16384,)
    >>> compile_buckets(1001)
    (1008,)
    """
    from ..collate import length_buckets

    return length_buckets(budget, count=1, multiple=8)


def plan_padding(sampler, buckets: tuple[int, ...]) -> float | None:
    """Pad slots / all slots the buckets add over ``sampler``'s epoch plan (None: a sampler without a plan)."""
    from ..collate import bucket_padding_fraction

    plan = getattr(sampler, "plan", None)
    tokens = getattr(plan(), "row_tokens", None) if callable(plan) else None
    return None if tokens is None else bucket_padding_fraction(tokens, buckets)


def compiled_model(trainer):
    """The trainer's compiled model when it is ``torch.compile(trainer.model)`` itself (one process,
    no DDP/FSDP inside), the module the probe and the warm-up should run; else None."""
    wrapped = getattr(trainer, "model_wrapped", None)
    if wrapped is None or getattr(wrapped, "_orig_mod", None) is not trainer.model:
        return None
    return wrapped


@dataclass(frozen=True)
class CompilePlan:
    """What a compiled run trains with: the collator padding to buckets, and the report it starts."""

    collator: object
    report: CompileReport


def compile_plan(collator, sampler, budget: int) -> CompilePlan | None:
    """The collator a compiled run trains with, padded to :func:`compile_buckets` of ``budget``, and its
    report; None (with a warning) for a collator that pads to no buckets.

    >>> from packing_collators import FlatteningCollator
    >>> compile_plan(FlatteningCollator(), None, 1001).report.buckets
    (1008,)
    """
    buckets = compile_buckets(budget)
    bucketed = bucketed_collator(collator, buckets)
    buckets = getattr(getattr(bucketed, "options", None), "pad_to_buckets", None)
    if buckets is None:
        logger.warning(
            "PackingTrainer(torch_compile=True): the data collator (%s) does not pad to buckets, so each new "
            "batch length may recompile. Use FlatteningCollator (optionally pad_to_buckets=...).",
            type(collator).__name__,
        )
        return None
    return CompilePlan(bucketed, CompileReport(buckets, plan_padding(sampler, buckets) or 0.0))


class CompileWarmUp(TrainerCallback):
    """PackingTrainer's compile hooks (a ``TrainerCallback``'s events): the layers compiled at construction,
    every graph of the :class:`CompilePlan` it is given compiled when training begins, recompiles counted after.
    ``report`` is the :class:`CompileReport` (None until a compiled run prepares its dataloader).
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.report: CompileReport | None = None
        self.collator = None
        compiling = trainer.args.torch_compile and trainer.model is not None  # the layers compiled here, in place
        self.whole_model = compile_trainer_layers(trainer) if compiling else None  # why not ("": they are)
        self._before_warm_up = self._before_training = None

    def prepare(self, plan: CompilePlan) -> None:
        """Warm up ``plan``'s collator when training begins; graphs count from now on (the probe's apart)."""
        self.collator, self.report = plan.collator, plan.report
        self._before_warm_up = graphs_compiled()  # the probe runs the compiled model: its graph counts

    def on_train_begin(self, args, state, control, **kwargs):
        if self.collator is None:
            return
        trainer = self.trainer
        model = trainer.model_wrapped
        vocab = int(text_config(trainer.model).vocab_size)

        def step(batch) -> None:
            inputs, items = trainer_step_inputs(trainer, batch, args.device)
            with trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, inputs, num_items_in_batch=items)
            loss.backward()

        model.train()
        self.report.seconds, self.report.graphs = warm_up_compiled(
            step, self.collator, self.report.buckets, vocab=vocab
        )
        model.zero_grad(set_to_none=True)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.report is not None and self._before_training is None:
            self._before_training = graphs_compiled()  # the warm-up's graphs and the probe's
            self.report.probe_graphs = self._before_training - self._before_warm_up - self.report.graphs
            logger.warning("PackingTrainer: %s", self.report.summary())

    def on_step_end(self, args, state, control, **kwargs):
        if self._before_training is None:
            return
        recompiles = graphs_compiled() - self._before_training
        if recompiles > self.report.recompiles:
            logger.warning(
                "PackingTrainer: torch.compile compiled %d graph(s) at step %d, after the warm-up (%s).",
                recompiles - self.report.recompiles,
                state.global_step,
                "TORCH_LOGS=recompiles says why",
            )
            self.report.recompiles = recompiles


def compile_trainer_layers(trainer) -> str:
    """``torch_compile=True``: the layers compiled in place (``compile_layers``), accelerate's whole-model compile
    off; returns "" then, else why the model stays compiled whole (by accelerate, as the stock Trainer does)."""
    from accelerate.utils import DynamoBackend

    from ..models import compile_layers, layer_compile_blocker

    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled or trainer.sequence_parallel_mesh is not None:
        return "FSDP, DeepSpeed and sequence parallelism compile through accelerate"
    if why := layer_compile_blocker(trainer.model):
        return why
    compile_layers(trainer.model, backend=trainer.args.torch_compile_backend, mode=trainer.args.torch_compile_mode)
    trainer.accelerator.state.dynamo_plugin.backend = DynamoBackend.NO
    return ""
