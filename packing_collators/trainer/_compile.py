"""Packed training under ``torch.compile``: the layers compiled in place, every graph compiled before the first step.

    PackingTrainer(compile_layers="auto") on a CUDA GPU, or torch_compile=True
      compile_layers(model)      each decoder layer's forward compiled (dynamic shapes), in place; the loss
                                 chunked outside the graph; accelerate kept from compiling the whole model
                                 (else eager, or under torch_compile=True whole, with the reason: FSDP
                                 version 1, DeepSpeed, sequence parallelism, hybrids, VLMs; "auto": quantized,
                                 PEFT); under FSDP2 before accelerate shards them: its hooks stay outside
      T                          padded to a bucket (the token budget); the padding a segment of its own;
                                 traced static in training steps (bucket_rows), dynamic elsewhere (the probe)
      n, max_length              symbolic: the attention ops take them as SymInts (FA4's custom op, torch's
                                 varlen op); traced dynamic from the first compile (symbolic_packing_sizes)
      warm_up_compiled           forward and backward on two bucket-sized batches before the first step

so no training step compiles (PackingTrainer counts a later recompile and warns). The live probe runs
the compiled model on its own shapes, its graphs counted apart (``CompileReport.probe_graphs``).
Cost: the compiles (seconds each on a GPU), once, and the buckets' padding (``CompileReport``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from dataclasses import dataclass

from transformers import TrainerCallback

from .._compat import dynamo_sources_by_pattern, trainer_step_inputs
from .._model_unwrap import text_config
from ..collate import bucketed_collator, compile_buckets, plan_padding
from ..models import bucket_rows, graphs_compiled, symbolic_packing_sizes
from ._autocast import training_autocast
from ._metrics import PackingMetricsCallback

__all__ = [
    "CompilePlan",
    "CompileReport",
    "CompileWarmUp",
    "compile_plan",
    "compile_trainer_layers",
    "compiled_model",
    "warm_up_compiled",
    "warm_up_lengths",
]

logger = logging.getLogger(__name__)
# the most buckets whose row lengths training traces static, a graph (or a few) each: under Dynamo's limit per
# compiled function (RECOMPILE_LIMIT), and few compiles; more buckets share one graph, the row length symbolic
STATIC_BUCKETS = 8


@dataclass
class CompileReport:
    """What compiling a packed run cost.

    Attributes:
        buckets: the row lengths micro-batches are padded to.
        padding_fraction: pad slots / all slots the buckets add over the epoch's plan.
        graphs: training graphs the warm-up compiled before the first step (a few: checkpointing's recompute is one).
        probe_graphs: the other graphs compiled before the first step (the live probe's, FA4's warm-up's).
        seconds: wall time of the warm-up.
        recompiles: graphs compiled after the warm-up, during training (0 expected).
        static_rows: the training steps trace the row length static (``bucket_rows``: a graph per bucket): the
            layers compiled, one bucket, or at most ``STATIC_BUCKETS`` on torch 2.8 on; else symbolic (one graph).
    """

    buckets: tuple[int, ...]
    padding_fraction: float
    graphs: int = 0
    seconds: float = 0.0
    recompiles: int = 0
    probe_graphs: int = 0
    static_rows: bool = True

    def summary(self) -> str:
        """One line for a log.

        >>> CompileReport((16384,), 0.0071, graphs=1, seconds=41.5, probe_graphs=2).summary()
        'torch.compile: 1 training graph(s) compiled before the first step in 41.5 s (and 2 for the live probe); micro-batches padded to (16384,) tokens, traced static (padding 0.71% of slots); 0 recompiles since'
        """
        probe = f" (and {self.probe_graphs} for the live probe)" if self.probe_graphs else ""
        rows = "static" if self.static_rows else "symbolic"
        return (
            f"torch.compile: {self.graphs} training graph(s) compiled before the first step in {self.seconds:.1f} s"
            f"{probe}; micro-batches padded to {self.buckets} tokens, traced {rows}"
            f" (padding {100 * self.padding_fraction:.2f}% of slots); {self.recompiles} recompiles since"
        )


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
        logger.warning("PackingTrainer, compiled: the data collator (%s) does not pad to buckets, so each "
                       "new batch length may recompile. Use FlatteningCollator (optionally pad_to_buckets=...).",
                       type(collator).__name__)  # fmt: skip
        return None
    # a graph per bucket, the packing sizes symbolic: where Dynamo names them from the first trace (torch 2.8 on);
    # before, automatic dynamic shapes would make a second bucket's length symbolic too
    static = len(buckets) == 1 or (len(buckets) <= STATIC_BUCKETS and dynamo_sources_by_pattern())
    report = CompileReport(buckets, plan_padding(sampler, buckets) or 0.0, static_rows=static)
    return CompilePlan(bucketed, report)


class CompileWarmUp(TrainerCallback):
    """PackingTrainer's compile hooks: the layers compiled at construction, the :class:`CompilePlan`'s graphs when
    training begins, recompiles counted after; ``report`` (:class:`CompileReport`) once the dataloader is built.

    ``option`` is PackingTrainer's ``compile_layers``: ``"auto"`` compiles the layers where
    :func:`auto_compile_blocker` finds nothing against it (a CUDA GPU, ...), True wherever they compile one by one,
    False never (``torch_compile=True`` then compiles the whole model, accelerate's way). ``enabled``: whether
    training runs compiled (buckets, warm-up), by the layers or, under ``torch_compile=True``, whole."""

    def __init__(self, trainer, option: bool | str = "auto") -> None:
        if option not in (True, False, "auto"):
            raise ValueError(f"compile_layers must be 'auto', True or False, got {option!r}.")
        self.trainer, self.option, self.enabled = trainer, option, bool(trainer.args.torch_compile)
        self.report: CompileReport | None = None
        self.collator = None
        self.whole_model: str | None = None  # compiled: why the model is compiled whole ("": by layer)
        self._before_warm_up = self._before_training = None
        if trainer.model is not None:
            self.compile_layers(trainer.model)

    def compile_layers(self, model) -> None:
        """Compile ``model``'s layers in place (at construction, and for a model ``model_init`` builds anew)."""
        from ..models import auto_compile_blocker, compiled_step_failure, uncompile_layers

        args = self.trainer.args
        self.enabled, self.whole_model = bool(args.torch_compile), None
        if self.option is False:
            if uncompile_layers(model):
                logger.warning("PackingTrainer(compile_layers=False): the model's compiled layers run eager again.")
            self.whole_model = "compile_layers=False" if self.enabled else None
            return
        if args.torch_compile:
            self.whole_model = compile_trainer_layers(self.trainer, model)
            return
        why = compile_trainer_layers(self.trainer, model, only_check=True)
        if why and self.option is True:
            raise ValueError(f"PackingTrainer(compile_layers=True): {why}. Pass compile_layers='auto' or False.")
        if self.option == "auto":  # compiled, and one step tried, where nothing speaks against it; else eager
            liger = "Liger's kernels replace modules inside the layers when training begins" * bool(
                getattr(args, "use_liger_kernel", False)
            )
            why = why or liger or auto_compile_blocker(model, args.device)
            tried = not why  # compiled and a step tried: a failure from here on is worth a warning
            why = why or compile_trainer_layers(self.trainer, model) or compiled_step_failure(
                model, autocast=training_autocast(args, model)
            )
            if why := _agreed(why, args.device):
                uncompile_layers(model)
                (logger.warning if tried else logger.info)(
                    "PackingTrainer: the layers train eager (compile_layers='auto'): %s.", why)  # fmt: skip
                return
        else:
            compile_trainer_layers(self.trainer, model)
        self.enabled, self.whole_model = True, ""
        logger.warning("PackingTrainer: the decoder layers are compiled in place (compile_layers=%r; every graph "
                       "compiles before the first step; compile_layers=False trains eager).", self.option)  # fmt: skip

    def accelerator_made(self) -> None:
        """The trainer's accelerator made anew (a hyperparameter trial): prepared as the first one was, where the
        layers are compiled."""
        if self.whole_model == "":
            _prepare_uncompiled(self.trainer.accelerator)

    def training_rows(self):
        """The context of a training step (and the warm-up's): :func:`bucket_rows` where the layers are compiled and
        the micro-batches padded to at most ``STATIC_BUCKETS`` buckets, so the row length is traced static; else
        none."""
        static = self.collator is not None and self.report.static_rows
        return bucket_rows() if static else contextlib.nullcontext()

    def probe_collator(self):
        """The live probe's collator with the layers compiled (dynamic shapes): the one before bucket padding."""
        return self.trainer.data_collator if self.whole_model == "" else None

    def prepare(self, plan: CompilePlan) -> None:
        """Warm up ``plan``'s collator when training begins; graphs count from now on (the probe's apart)."""
        self.collator, self.report = plan.collator, plan.report
        self.report.static_rows &= self.whole_model == ""  # a model compiled whole traces its own shapes
        for callback in self.trainer.callback_handler.callbacks:  # the metrics count the bucket's padding as such
            if isinstance(callback, PackingMetricsCallback):
                callback.pads_like(plan.collator)
        self._before_warm_up = graphs_compiled()  # the probe runs the compiled model: its graph counts

    def on_train_begin(self, args, state, control, **kwargs):
        if self.collator is None:
            return
        trainer = self.trainer
        model = trainer.model_wrapped
        vocab = int(text_config(trainer.model).vocab_size)

        def step(batch) -> None:
            inputs, items = trainer_step_inputs(trainer, batch, args.device)
            with self.training_rows():  # as a training step runs (PackingTrainer.training_step)
                with trainer.compute_loss_context_manager():
                    loss = trainer.compute_loss(model, inputs, num_items_in_batch=items)
                loss.backward()

        model.train()
        try:
            self.report.seconds, self.report.graphs = warm_up_compiled(
                step, self.collator, self.report.buckets, vocab=vocab
            )
        except Exception as error:  # the first compiled step: where a model the tried step never ran fails
            raise RuntimeError(  # (under FSDP the model sat off the GPU at construction, untried)
                f"PackingTrainer: the compiled model failed its warm-up before the first step ({type(error).__name__}: "
                f"{' '.join(str(error).split())[:300]}). Pass compile_layers=False (and torch_compile=False) to train eager."
            ) from error
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
            new, self.report.recompiles = recompiles - self.report.recompiles, recompiles
            logger.warning("PackingTrainer: torch.compile compiled %d graph(s) at step %d, after the warm-up "
                           "(TORCH_LOGS=recompiles says why).", new, state.global_step)  # fmt: skip


def compile_trainer_layers(trainer, model, *, only_check: bool = False) -> str:
    """``model``'s layers compiled in place (``compile_layers``), and this trainer's accelerator kept from compiling
    the whole model; returns "" then, else why they cannot be (compiled whole, accelerate's way, under
    ``torch_compile=True``). ``only_check``: the reason alone, nothing compiled."""
    from ..models import compile_layers, layer_compile_blocker

    args = trainer.args
    if trainer.is_deepspeed_enabled or trainer.sequence_parallel_mesh is not None:
        return "DeepSpeed and sequence parallelism compile through accelerate"
    if trainer.is_fsdp_enabled and not getattr(trainer.accelerator, "is_fsdp2", False):
        return "FSDP version 1 flattens the layers' parameters (fsdp_config={'version': 2} compiles the layers)"
    if (why := layer_compile_blocker(model, mode=args.torch_compile_mode)) or only_check:
        return why
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None) if trainer.is_fsdp_enabled else None
    checkpoint = _takes_over_checkpointing(plugin, model)  # FSDP2's: into the layers' graphs
    _fa4_as_one_op(model)
    compile_layers(model, backend=args.torch_compile_backend, mode=args.torch_compile_mode, checkpoint=checkpoint)
    _prepare_uncompiled(trainer.accelerator)
    return ""


def _fa4_as_one_op(model) -> None:
    """A model on transformers' ``flash_attention_4`` runs ``packing_fa4`` once its layers compile: the same kernel
    and arguments, called as one custom op, where Dynamo would trace into transformers' wrapper and break the graph
    at FA4's DLTensorWrapper and lru_cache calls (a 28-layer model then compiled for minutes). The trainer's batches
    are packed rows, all that ``packing_fa4`` leaves out is padding and decoding with a cache."""
    from .._compat import attn_implementation
    from ..attention import FA4_ATTENTION, register_fa4_attention

    if attn_implementation(text_config(model)) == "flash_attention_4":
        register_fa4_attention()
        model.set_attn_implementation(FA4_ATTENTION)
        logger.info("PackingTrainer: flash_attention_4 runs as %s in the compiled layers (the same kernel, one op).",
                    FA4_ATTENTION)  # fmt: skip


def _takes_over_checkpointing(fsdp, model) -> bool:
    """Whether the FSDP plugin's ``activation_checkpointing`` can move into ``model``'s compiled layers' graphs: it is
    on, not offloaded to the CPU (accelerate's ``save_on_cpu`` wrapper goes with its checkpoint wrapper), and every
    module accelerate would wrap for it is one of the repeated layers (a size-based policy may wrap others)."""
    if not getattr(fsdp, "activation_checkpointing", False) or getattr(fsdp, "activation_checkpointing_offload", False):
        return False
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    from ..models import repeated_layers

    try:
        policy = fsdp2_prepare_auto_wrap_policy(fsdp, model)
    except ValueError:  # a class name the model does not have: accelerate says so when it prepares
        return False
    layers = {id(layer) for layer in repeated_layers(model)}
    wrapped = [module for module in model.modules() if module is not model and policy is not None and policy(module)]
    return bool(wrapped) and all(id(module) in layers for module in wrapped)


def _agreed(why: str, device) -> str:
    """``why`` where every process of the job compiles too ("" on each): a process left eager would skip the warm-up's
    steps that the others run through their collectives. Else the reason (this process's, or another's)."""
    from .._rank_agreement import failing_ranks

    failed = failing_ranks(bool(why), device)
    return why or ("another process of the job cannot compile its layers (its log says why)" if failed else "")


def _prepare_uncompiled(accelerator) -> None:
    """``accelerator.prepare`` and ``prepare_model`` (FSDP2 prepares in ``prepare``) with accelerate's dynamo backend
    off for the call: the layers are compiled, and the plugin (shared by every Accelerator of the process) is left as
    it was for the next Trainer. Likewise the FSDP plugin's ``activation_checkpointing`` where the model's layers
    checkpoint inside their graphs (``checkpointed_layers``): its wrapper would checkpoint around the compiled forward
    (measured slower on 2 H200s at 8B: docs/benchmarks.md); a model left eager is wrapped as accelerate wraps it."""
    for name in ("prepare", "prepare_model"):
        original = getattr(accelerator, f"_packing_{name}", None) or getattr(accelerator, name)
        setattr(accelerator, f"_packing_{name}", original)
        setattr(accelerator, name, functools.partial(_uncompiled_call, accelerator, original))


def _uncompiled_call(accelerator, original, *args, **kwargs):
    """``original(*args, **kwargs)`` (a preparation) under :func:`_prepare_uncompiled`'s settings, restored after."""
    import torch
    from accelerate.utils import DynamoBackend

    from ..models import checkpointed_layers, repeated_layers

    plugin, fsdp = accelerator.state.dynamo_plugin, getattr(accelerator.state, "fsdp_plugin", None)
    backend, checkpointing = plugin.backend, getattr(fsdp, "activation_checkpointing", False)
    models = [a for a in [*args, *kwargs.values()] if isinstance(a, torch.nn.Module)]
    plugin.backend = DynamoBackend.NO
    if any(_takes_over_checkpointing(fsdp, m) and checkpointed_layers(m) == len(repeated_layers(m)) for m in models):
        fsdp.activation_checkpointing = False
    try:
        return original(*args, **kwargs)
    finally:
        plugin.backend = backend
        if fsdp is not None:
            fsdp.activation_checkpointing = checkpointing
