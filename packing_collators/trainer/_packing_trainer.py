"""``PackingTrainer``: ``transformers.Trainer`` with token-budget (multipack) micro-batches.

Switching a Trainer script is one line::

    trainer = Trainer(model=model, args=args, train_dataset=ds)         # padded batches
    trainer = PackingTrainer(model=model, args=args, train_dataset=ds)  # packed micro-batches

What changes underneath::

    sampler     MultipackBatchSampler(lengths, max_tokens_per_batch, num_replicas=world, rank=rank)
                -> each rank gets its own, equally many, index lists per epoch
    collator    FlatteningCollator()  (unless you pass one) -> one flat row per micro-batch
    accelerate  its batch-sampler shard wrapper is made a pass-through (no double sharding)
    checks      check_packing_support(model, first collated batch) before the first step
    metrics     PackingMetricsCallback: num_tokens, padding_fraction, packing_efficiency, ... in the logs

Everything else is the stock Trainer: gradient accumulation with ``num_items_in_batch``
(a token-weighted loss, as with padding), LR schedule from ``len(train_dataloader)``
(the sampler's exact count for this rank), ``set_epoch`` each epoch, mid-epoch resume
(the Trainer skips the batches already trained; the sampler is deterministic per epoch).
Cost: one pass over the lengths column per epoch to plan it (docs/benchmarks.md: planning an epoch).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from .._compat import positional_collator, train_batch_size, trainer_hooks
from .._validation import validate_choice, validate_flag
from ..attention import AUTO_ATTENTION, choose_attention
from ..batch import target_count
from ..budget import PlannedBudget, TrainerBudget
from ..collate import FlatteningCollator
from ..engine import Overflow, Strategy
from ..sampler import check_sampler_option
from ._check_callback import PackingCheckCallback, add_packing_callbacks
from ._compile import CompileWarmUp
from ._dataloader import PackedLoader, multipack_dataloader, report_dropped
from ._deepspeed import check_deepspeed_setup
from ._gpu_run import gpu_run
from ._head_loss import HeadLoss, LossImplementation
from ._launch import refuse_data_parallel
from ._liger import check_liger_setup
from ._neftune import PackedNEFTune
from ._predictions import EXAMPLE_COUNT, examples_counted, is_flat_row, per_example_predictions
from ._prepare_model import prepare_trainer_model
from ._sequence_loss import LossNormalization, check_sequence_setup, global_sequence_count, sequence_compute_loss

try:
    from transformers import Trainer
except ImportError as error:  # pragma: no cover - transformers is a dependency
    raise ImportError("PackingTrainer needs transformers (pip install transformers).") from error

__all__ = ["PackingCheckCallback", "PackingTrainer"]

EvalPacking = Literal["off", "multipack"]


@trainer_hooks  # the Trainer's private hooks (epoch start, kept columns, target count): see _compat.py
class PackingTrainer(Trainer):
    """A ``transformers.Trainer`` whose training micro-batches hold up to ``max_tokens_per_batch`` tokens.

    Args (keyword-only; everything else goes to ``Trainer``):
        max_tokens_per_batch: token budget of one micro-batch on one rank. ``None``
            (default): ``per_device_train_batch_size`` times the mean example length
            (at least the longest example), so a step sees about as many examples as
            the padded run did, with less memory than its worst padded batch.
            ``"auto"``: measured once on the model and its GPU for the longest example
            (:func:`measure_token_budget`, at most 262,144 tokens; the smallest over ranks), logged. The plan follows
            the budget: to resume mid-epoch with the same batches, pass the logged number.
        memory_check: on a CUDA model (not under FSDP or DeepSpeed), run a training step's
            worth of memory at the training budget before the first step
            (:func:`check_token_budget`: two forward + backward passes on examples of the
            longest length the budget holds, AdamW's states counted) and refuse a budget that
            runs out of memory or passes 90% of the card, with the numbers (default True).
        strategy: the sampler's bin-packing strategy (``"bfd"``, ``"ffd"``, ``"next_fit"``).
        attention_weight: the weight of attention in the sampler's rank-balancing cost
            (``None``: ``1 / max_tokens_per_batch``; a value from :func:`fit_attention_weight`
            when ranks still wait on each other; see ``MultipackBatchSampler``).
        length_column: the column whose lengths are packed (``"input_ids"``).
        eval_packing: ``"off"`` (default: the stock eval sampler, batches still flattened
            by the collator) or ``"multipack"`` (token-budget eval batches). Either way
            ``eval_loss`` is token-weighted (the same however examples are batched), and
            ``predict()`` returns one row per example, in dataset order.
        overflow: an example longer than the token budget: ``"error"`` (default) or
            ``"drop"`` (left out, and the count logged as a warning).
        packing_probe: run the live equivalence probe when training begins (default
            True; see :class:`PackingCheckCallback`). Turn it off only for a model whose
            packed loss you have checked against padding.
        attn_implementation: ``"auto"`` (default): the fastest packed-correct attention this
            machine runs (FlashAttention-4 on Hopper/Blackwell when installed, then FA3, FA2,
            ``packing_varlen`` on any CUDA GPU; on a CPU the model's own), logged when it
            changes the model's; ``None``: keep the model's; or a name to set.
        attention_warm_up: under FlashAttention-4, compile its kernel variants before the first
            step (default True), so no step stalls compiling (see :func:`warm_up_attention`).
        sequence_parallel_size: ranks that share one micro-batch (default 1: off). Each group of
            this many ranks trains one packed row of up to ``n x max_tokens_per_batch`` tokens, each
            rank ``1/n`` of it, attention through Ulysses all-to-alls (:mod:`packing_collators.parallel`);
            the loss and gradients equal the one-GPU run of the same micro-batches. Launch with
            ``torchrun``; see docs/sequence_parallel.md.
        packing_metrics: add ``num_tokens``, ``tokens_per_second``, ``padding_fraction``,
            ``examples_per_step`` and ``packing_efficiency`` to the training logs (default
            True; see :class:`PackingMetricsCallback`).
        loss_normalization: ``"token"`` (default): the training loss is the mean over all target
            tokens of the optimizer step (``num_items_in_batch``), as padding gives; ``"sequence"``:
            each example's mean token loss, averaged over the step's examples (counted over
            micro-batches and ranks like ``num_items_in_batch``), so each example counts once and
            a short example's tokens weigh more (see :func:`sequence_loss_weights`). Evaluation
            stays token-weighted. Not with Liger's fused loss (which never forms the logits).
        loss_implementation: ``"auto"`` (default): the loss from the last hidden states a chunk of at most
            4,096 tokens at a time, never the full ``T x V`` logits nor their float32 copy (the same numbers:
            :mod:`packing_collators.loss`), once a check on the model confirms what its head computes; else,
            and where the logits are needed (a label smoother, ``compute_loss_func``, Liger's fused loss,
            ``torch_compile=True``, evaluation for ``compute_metrics``), the full logits, the reason logged.
            ``"chunked"``: the same, refused where it cannot run; ``"full"``: the stock full-logit loss.
        compile_layers: ``"auto"`` (default): on a CUDA GPU, compile each decoder layer in place, the loss
            still chunked (measured against TRL in docs/benchmarks.md), where the model allows it (not quantized,
            no PEFT adapters or Liger, no FSDP version 1, DeepSpeed or sequence parallelism, and one compiled step
            runs at construction where the model is on the GPU), else eager with the reason logged; under FSDP2
            the layers are compiled before accelerate shards them;
            ``True``: the same, refused where it cannot; ``False``: eager (``torch_compile=True``: whole).

    ``data_collator`` defaults to :class:`FlatteningCollator`. Before the first step the
    model and the first collated batch go through :func:`check_packing_support`; a DeepSpeed
    config is checked at construction and Liger's fused loss when training begins (what would
    make the loss or the batches inexact is refused: ``docs/setups.md``). So is one process on
    several GPUs (``python train.py`` without ``torchrun``: ``args.n_gpu > 1``, which the Trainer
    would train under ``torch.nn.DataParallel``), at construction.

    Compiled (``compile_layers`` or ``TrainingArguments(torch_compile=True)``), micro-batches are padded to one
    bucket, every graph compiled before the first step, ``trainer.compile_report`` logged (``_compile.py``).

    >>> PackingTrainer.__mro__[1].__name__
    'Trainer'
    >>> PackingTrainer(max_tokens_per_batch=0)
    Traceback (most recent call last):
    ...
    ValueError: max_tokens_per_batch must be a positive integer or None (derived from the batch size; or 'auto', measured on the GPU), got 0.
    """

    def __init__(
        self,
        *args: Any,
        max_tokens_per_batch: int | Literal["auto"] | None = None,
        memory_check: bool = True,
        strategy: Strategy = "bfd",
        attention_weight: float | None = None,
        length_column: str = "input_ids",
        eval_packing: EvalPacking = "off",
        overflow: Overflow = "error",
        packing_probe: bool = True,
        attn_implementation: str | None = AUTO_ATTENTION,
        packing_metrics: bool = True,
        attention_warm_up: bool = True,
        loss_normalization: LossNormalization = "token",
        loss_implementation: LossImplementation = "auto",
        sequence_parallel_size: int = 1,
        compile_layers: bool | Literal["auto"] = "auto",
        **kwargs: Any,
    ) -> None:
        self.strategy = check_sampler_option("strategy", strategy)
        self.attention_weight = check_sampler_option("attention_weight", attention_weight)
        self.overflow = check_sampler_option("overflow", overflow)
        validate_choice("loss_normalization", loss_normalization, LossNormalization)
        validate_choice("eval_packing", eval_packing, EvalPacking)
        # the budget's setting, checked here; each dataloader plans its value from it (budget/_trainer_budget.py)
        self._budget = TrainerBudget(
            max_tokens_per_batch, memory_check=validate_flag("memory_check", memory_check),
            sequence_parallel_size=sequence_parallel_size,
        )  # fmt: skip
        packing_probe = validate_flag("packing_probe", packing_probe)
        self.sequence_parallel_size = self._budget.sequence_parallel_size
        self.length_column = length_column
        self.eval_packing = eval_packing
        self.loss_normalization = loss_normalization
        self._head_loss = HeadLoss(loss_implementation)  # the loss a chunk of tokens at a time, or the full logits
        self._loss_only = True  # evaluation: whether the step needs the loss alone (no logits for compute_metrics)
        self._train_loader: PackedLoader | None = None  # what the train dataloader's builder made
        self._eval_token_loss = None  # (sum of token losses, target tokens) of the evaluation under way
        self._sequence_parallel = None
        if not positional_collator(args) and kwargs.get("data_collator") is None:
            kwargs["data_collator"] = FlatteningCollator()
        super().__init__(*args, **kwargs)
        if self.neftune_noise_alpha is not None:  # NEFTune's noise per example, not per packed row (_neftune.py)
            self.add_callback(PackedNEFTune(self.neftune_noise_alpha))
            self.neftune_noise_alpha = None
        refuse_data_parallel(self.args, "PackingTrainer")  # python train.py on several GPUs: DataParallel
        check_deepspeed_setup(self)
        check_sequence_setup(self)
        prepare_trainer_model(self, self.model)  # enable_packing: hybrids and VLMs keep the packed examples apart
        self.attn_implementation = choose_attention(self.model, attn_implementation) if self.model is not None else None
        if self.sequence_parallel_size > 1:  # every rank checks before the mesh's first collective: no hang on refusal
            from ._sequence_parallel import setup_sequence_parallel

            self._sequence_parallel = setup_sequence_parallel(self, self.sequence_parallel_size)
        self._compile = CompileWarmUp(self, compile_layers)  # the layers, buckets, warm-up, recompiles (_compile.py)
        self._warm_up, self._startup = add_packing_callbacks(self, probe=packing_probe, warm_up=attention_warm_up,
                                                             metrics=packing_metrics)  # fmt: skip

    @property
    def sequence_parallel_mesh(self):
        """The :class:`SequenceParallelMesh` under ``sequence_parallel_size > 1`` (built at construction); else None."""
        return self._sequence_parallel

    @property
    def longest_train_sequence(self) -> int | None:
        """The longest sequence a training micro-batch holds (an example, or a compile bucket's padding
        segment), once the train dataloader is built; None before (FA4's warm-up compiles up to it)."""
        return self._train_loader.warm_up_length if self._train_loader is not None else None

    @property
    def _train_batch_sampler(self):
        """The train dataloader's batch sampler (set_epoch on resume; the metrics' budget); None before."""
        return self._train_loader.sampler if self._train_loader is not None else None

    @property
    def startup_seconds(self) -> dict[str, float]:
        """Seconds of each part the library runs before the first step (``token_budget``, ``checks_and_probe``,
        ``compile``, ``fa4_warm_up``, ``kernel_checks``: see ``trainer/_startup.py``), logged as it begins."""
        return dict(self._startup.collect())

    @property
    def compile_report(self):
        """What compiling cost (:class:`CompileReport`), under ``torch_compile=True``; else None."""
        return self._compile.report

    @property
    def max_tokens_per_batch(self) -> int | Literal["auto"] | None:
        """The budget as given (``max_tokens_per_batch=``); a dataloader's own is :meth:`token_budget`'s.
        Setting it checks it, for the dataloaders built after."""
        return self._budget.max_tokens_per_batch

    @max_tokens_per_batch.setter
    def max_tokens_per_batch(self, value) -> None:
        budget = self._budget
        self._budget = TrainerBudget(
            value, memory_check=budget.memory_check, sequence_parallel_size=budget.sequence_parallel_size
        )

    def planned_budget(self, lengths: np.ndarray, batch_size: int, *, training: bool = False) -> PlannedBudget:
        """The micro-batch token budget for these example lengths (see ``max_tokens_per_batch``); a training
        one checked against the GPU (``memory_check``).

        Under ``sequence_parallel_size=n`` it is the group's: ``n`` times one rank's (a number, or
        ``"auto"`` measured for one rank's ``1/n`` of the longest example); ``None`` derives it from
        the batch size as for one GPU (``per_device_train_batch_size`` examples per micro-batch).
        Each dataloader plans it once and hands the value to :meth:`make_batch_sampler`.
        """
        if not training:
            return self._budget.plan(lengths, batch_size, gpu_run(self))
        with self._startup.part("token_budget"):  # "auto" measured, or the memory check: dry runs on the GPU
            return self._budget.plan(lengths, batch_size, gpu_run(self), training=True)

    def make_batch_sampler(self, lengths: np.ndarray, max_tokens_per_batch: int, *, shuffle: bool):
        """The batch sampler of a train (``shuffle=True``) or eval dataloader: this rank's index lists.

        ``max_tokens_per_batch`` is the dataloader's budget, planned once (:meth:`token_budget`).
        The default is a :class:`MultipackBatchSampler` over ``lengths`` at that budget, seeded
        by ``data_seed`` (else ``seed``), planned for ``world_size`` ranks. Override it to plan
        micro-batches another way; the result must yield lists of dataset indices and, for
        training, have ``set_epoch``.
        """
        from ..sampler import MultipackBatchSampler

        args = self.args
        mesh = self.sequence_parallel_mesh  # one micro-batch per group: dp_size replicas, this group's index
        replicas, rank = (mesh.dp_size, mesh.dp_rank) if mesh is not None else (args.world_size, args.process_index)
        return MultipackBatchSampler(
            lengths,
            max_tokens_per_batch,
            strategy=self.strategy,
            attention_weight=self.attention_weight,
            shuffle=shuffle,
            seed=args.data_seed if args.data_seed is not None else args.seed,
            num_replicas=replicas,
            rank=rank,
            drop_last=args.dataloader_drop_last,
            overflow=self.overflow,
            progress=False if args.disable_tqdm else None,  # the Trainer's own switch silences planning too
        )

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        check_liger_setup(self)  # train() has applied use_liger_kernel by now
        built = multipack_dataloader(self, self.train_dataset, "Training", train_batch_size(self), shuffle=True)
        sampler = built.sampler
        if not callable(getattr(sampler, "set_epoch", None)):
            raise TypeError(
                f"{type(self).__name__}.make_batch_sampler returned a {type(sampler).__name__} without "
                "set_epoch(epoch); a training sampler needs one (called every epoch and on resume, so each "
                "epoch gets its own plan). Give it a set_epoch method, or subclass MultipackBatchSampler."
            )
        if built.compile_plan is not None:
            self._compile.prepare(built.compile_plan)
        self._train_loader = built
        report_dropped(sampler)
        return built.loader

    def get_eval_dataloader(self, eval_dataset=None):
        """The stock eval dataloader or (``eval_packing="multipack"``) token-budget batches; each batch counts its
        examples, so predictions are one row per example (see ``_predictions.py``)."""
        if self.eval_packing == "off":
            with examples_counted(self):
                return super().get_eval_dataloader(eval_dataset)
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            eval_dataset = self.eval_dataset
        with examples_counted(self):
            built = multipack_dataloader(self, eval_dataset, "Evaluation", self.args.eval_batch_size, shuffle=False)
        return built.loader

    def get_test_dataloader(self, test_dataset):
        with examples_counted(self):
            return super().get_test_dataloader(test_dataset)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The stock step's micro-batches; under ``loss_normalization="sequence"`` their example count."""
        if self.loss_normalization != "sequence":
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batch_samples = []
        for _ in range(num_batches):
            try:
                batch_samples.append(next(epoch_iterator))
            except StopIteration:
                break
        return batch_samples, global_sequence_count(self, batch_samples, device)

    def training_step(self, model, inputs, *args, **kwargs):
        with self._compile.training_rows():  # compiled layers, rows padded to a bucket: the row length traced static
            return super().training_step(model, inputs, *args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The stock loss (or, in training under ``loss_normalization="sequence"``, the per-sequence mean),
        computed a chunk of tokens at a time unless the logits are needed (see ``loss_implementation``)."""
        if "labels" in inputs and (model.training or self._loss_only):
            head = self._head_loss.head(self, model, inputs)
            if head is not None:
                loss, outputs = self._head_loss.compute(self, model, inputs, head, num_items_in_batch)
                return (loss, outputs) if return_outputs else loss
        if self.loss_normalization == "sequence" and model.training:
            return sequence_compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    # Columns a pre-packed dataset (pack_dataset) carries that the model's forward may not name.
    packing_columns = ("position_ids", "seq_lengths")

    def _packing_items(self, batch_samples: list, device):
        """Training: the targets of every rank's micro-batches of the step (under sequence parallelism, the
        shards' shift_labels). Evaluation: None, so each batch's loss is its own mean, which prediction_step
        weights by the batch's targets (a count gathered over ranks there would scale it by the world size)."""
        if not self.model.training:
            return None
        if self.sequence_parallel_mesh is None:
            return NotImplemented  # the stock count
        from ._sequence_parallel import global_target_count

        return global_target_count(batch_samples, self.accelerator, device)

    def _packing_epoch(self, epoch) -> None:
        # On a mid-epoch resume the Trainer wraps the dataloader to skip batches, and its
        # set_epoch no longer reaches the sampler; set it here so the skipped plan is this epoch's.
        if self._train_batch_sampler is not None and epoch is not None:
            self._train_batch_sampler.set_epoch(int(epoch))
            if getattr(self, "_warm_up", None) is not None:  # the octaves this epoch's plan reaches first
                self._warm_up.new_epoch()

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The stock step, plus the token-weighted loss sums, and flat rows split back into examples."""
        import torch

        examples = inputs.pop(EXAMPLE_COUNT, None)  # how many the batch holds (its padding segment is none)
        self._loss_only = prediction_loss_only
        try:
            loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        finally:
            self._loss_only = True
        if loss is not None and inputs.get("labels") is not None and self._eval_token_loss is not None:
            count = target_count(inputs)  # the tokens predicted (a sequence shard's own)
            summed = torch.where(
                count > 0, loss.detach().float() * count, 0.0
            )  # a shard may hold no target (mean: nan)
            self._eval_token_loss += torch.stack((summed, count.float()))
        if is_flat_row(inputs) and not prediction_loss_only:
            main_input = getattr(self.model, "main_input_name", "input_ids")
            logits, labels = per_example_predictions(inputs, logits, labels, examples, main_input)
        return loss, logits, labels

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        """The stock loop, with ``{prefix}_loss`` token-weighted: all target tokens' losses / their count.

        The stock loop averages per-batch means, which weighs a token by its batch; with token-budget
        batches that biases the loss toward short examples. Token-weighted, the loss is the same
        however the examples are batched (padded, flattened or packed).
        """
        import torch

        self._eval_token_loss = torch.zeros(2, device=self.args.device)
        try:
            output = super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix=metric_key_prefix
            )
            total, count = self.accelerator.reduce(self._eval_token_loss, reduction="sum").tolist()
        finally:
            self._eval_token_loss = None
        if count and output.metrics is not None and f"{metric_key_prefix}_loss" in output.metrics:
            output.metrics[f"{metric_key_prefix}_loss"] = total / count
        return output

    def call_model_init(self, trial=None):
        """The stock ``model_init`` call; a model ``train()`` builds anew is prepared as the first one was
        (``enable_packing``, the attention implementation chosen at construction, its layers compiled)."""
        model = super().call_model_init(trial)
        if getattr(self, "attn_implementation", None) is not None:  # set after __init__'s own call
            prepare_trainer_model(self, model)
            choose_attention(model, self.attn_implementation)
            self._compile.compile_layers(model)
        return model

    def create_accelerator_and_postprocess(self):
        """The stock accelerator; one made anew (a hyperparameter trial's, after ``model_init``) prepares the
        compiled layers as the first one did (``_compile.py``: no whole-model compile, FSDP2's checkpoint kept in
        the layers' graphs)."""
        super().create_accelerator_and_postprocess()
        if getattr(self, "_compile", None) is not None:  # set after __init__'s own call
            self._compile.accelerator_made()

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix="test"):
        """Per-example predictions in dataset order: sequential batches (never multipack), flat rows split."""
        eval_packing, self.eval_packing = self.eval_packing, "off"
        try:
            return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        finally:
            self.eval_packing = eval_packing
