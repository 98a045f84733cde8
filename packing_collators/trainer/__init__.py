"""Trainer integration: PackingTrainer, its callbacks and dataloaders, the token budget, compile support.

_packing_trainer.py   PackingTrainer (loads transformers on first use)
_prepare_model.py     enable_packing on the model (and on one model_init builds); sequence parallelism refused
                      where state crosses ranks
_predictions.py       predict() / compute_metrics: one row per example, a collator's padding segment none
_neftune.py           NEFTune's noise per example; the stock Trainer's (per row) refused
_dataloader.py        PackingTrainer's dataloaders: lengths -> the budget -> sampler -> collator -> DataLoader
_check_callback.py    PackingCheckCallback and the FA4 warm-up, added when training begins
_autocast.py          the autocast the Trainer trains under: the probe's forwards and the budget's dry runs

The plumbing another trainer on packed rows builds on (PackingDPOTrainer does): ``prepared_loader`` (a sampler's
micro-batches through accelerate), ``training_autocast`` (what runs outside the steps runs as they do),
``warm_up_packed_attention`` (FA4's kernels compiled before the first step), ``memory_model`` and
``autocast_dtype`` (what a token budget is measured on: ``budget.GpuRun``).
_gpu_run.py           what the token budget (../budget/) is measured on: the model on one GPU, the autocast, the loss
_compile.py           torch_compile=True: the layers compiled in place, rows padded to buckets, graphs compiled first
_metrics.py           PackingMetricsCallback: num_tokens, padding, packing efficiency in the logs
_launch.py            one process on several GPUs (python train.py, DataParallel) refused, naming torchrun
_deepspeed.py         the DeepSpeed config checks (batch numbers the sampler and Trainer own)
_liger.py             the Liger fused-loss checks (num_items_in_batch kept, what it cannot do)
_sequence_loss.py     sequence_loss_weights / sequence_mean_loss: each example counted once (loss_normalization="sequence")
_sequence_parallel.py PackingTrainer(sequence_parallel_size=n): the mesh, the checks, the loss, the probe

Built on every other folder: the attention backends (``attention/``), the checks and the probe
(``checks/``), sequence parallelism (``parallel/``), the token budget (``budget/``), the sampler and the collators.
"""

from .._lazy import lazy_names
from ._autocast import autocast_dtype, training_autocast
from ._gpu_run import memory_model
from ._sequence_loss import count_sequences, sequence_loss_weights, sequence_mean_loss

__all__ = [
    "CompileReport",
    "PackingCheckCallback",
    "PackingMetricsCallback",
    "PackingTrainer",
    "autocast_dtype",
    "count_sequences",
    "memory_model",
    "prepared_loader",
    "sequence_loss_weights",
    "sequence_mean_loss",
    "training_autocast",
    "warm_up_compiled",
    "warm_up_packed_attention",
]


# PackingTrainer, the callbacks and the compile report subclass transformers' Trainer classes: importing
# those takes seconds, so they load on first use (one rule for every facade: _lazy.py).
__getattr__ = lazy_names(
    __name__,
    {
        "PackingTrainer": "._packing_trainer",
        "PackingCheckCallback": "._check_callback",
        "PackingMetricsCallback": "._metrics",
        "CompileReport": "._compile",
        "warm_up_compiled": "._compile",
        "warm_up_packed_attention": "._check_callback",
        "prepared_loader": "._dataloader",
    },
    moved={
        name: "packing_collators.budget (or packing_collators)"
        for name in ("TokenBudget", "check_token_budget", "fit_token_budget", "measure_token_budget", "plan_token_budget")
    },
)
