"""Trainer integration: the checks that keep examples apart, an attention backend, PackingTrainer.

_support_checks.py    check_packing_support: is this model + attention + batch packed-correct? (runs the ones below)
_model_unwrap.py      unwrap_model / probe_module: the transformers model inside DDP / FSDP / PEFT
_attention_kind.py    attention_kind: how an attention implementation keeps examples apart
_model_checks.py      check_model: forward signature, use_cache, rope, attention limits
_batch_checks.py      check_batch: a collated batch's packed layout against the attention
_collated_features.py check_collated_features: the collator keeps the dataset's examples apart
_probe.py             probe_packing: measured on the model itself (packed vs alone, and a leak test)
_varlen_attention.py  packing_varlen, an attention backend on torch.nn.attention.varlen
_fa4_attention.py     packing_fa4, FlashAttention-4's varlen kernel called straight from the batch
_attention_inputs.py  what both backends read from the batch: flat (1, T) tensors, causality, window, autocast
_attention_ops.py     FA4's kernel as torch.library custom ops (fake + autograd): traced by torch.compile
_attention_choice.py  choose_attention: the fastest packed-correct attention on this machine
_packing_trainer.py   PackingTrainer (loads transformers on first use)
_check_callback.py    PackingCheckCallback and the FA4 warm-up, added when training begins
_dataloader.py        PackingTrainer's dataloaders: lengths -> sampler -> collator -> DataLoader
_trainer_budget.py    max_tokens_per_batch="auto" and memory_check, agreed over ranks
_compile.py           torch_compile=True: rows padded to buckets, graphs compiled before the first step
_metrics.py           PackingMetricsCallback: num_tokens, padding, packing efficiency in the logs
_memory_budget.py     measure_token_budget / check_token_budget: max_tokens_per_batch against the GPU's memory, measured
_deepspeed.py         the DeepSpeed config checks (batch numbers the sampler and Trainer own)
_liger.py             the Liger fused-loss checks (num_items_in_batch kept, what it cannot do)
_sequence_loss.py     sequence_loss_weights / sequence_mean_loss: each example counted once (loss_normalization="sequence")
"""

from ._attention_choice import choose_attention, packed_attention_candidates, warm_up_attention
from ._collated_features import check_collated_features
from ._fa4_attention import FA4_ATTENTION, fa4_attention_forward, register_fa4_attention
from ._memory_budget import TokenBudget, check_token_budget, fit_token_budget, measure_token_budget, plan_token_budget
from ._probe import ProbeReport, probe_packing
from ._sequence_loss import count_sequences, sequence_loss_weights, sequence_mean_loss
from ._support_checks import check_packing_support
from ._varlen_attention import VARLEN_ATTENTION, register_varlen_attention, varlen_attention_forward

__all__ = [
    "CompileReport",
    "FA4_ATTENTION",
    "PackingCheckCallback",
    "PackingMetricsCallback",
    "PackingTrainer",
    "ProbeReport",
    "TokenBudget",
    "VARLEN_ATTENTION",
    "check_collated_features",
    "check_packing_support",
    "check_token_budget",
    "choose_attention",
    "count_sequences",
    "fa4_attention_forward",
    "fit_token_budget",
    "measure_token_budget",
    "packed_attention_candidates",
    "plan_token_budget",
    "probe_packing",
    "register_fa4_attention",
    "register_varlen_attention",
    "sequence_loss_weights",
    "sequence_mean_loss",
    "varlen_attention_forward",
    "warm_up_attention",
    "warm_up_compiled",
]


def __getattr__(name: str):
    # PackingTrainer / PackingCheckCallback / PackingMetricsCallback subclass transformers' Trainer
    # classes: importing those takes seconds, so they load on first use.
    if name in ("PackingCheckCallback", "PackingTrainer"):
        from . import _packing_trainer

        return getattr(_packing_trainer, name)
    if name in ("CompileReport", "warm_up_compiled"):  # _compile.py subclasses transformers' TrainerCallback
        from . import _compile

        return getattr(_compile, name)
    if name == "PackingMetricsCallback":
        from ._metrics import PackingMetricsCallback

        return PackingMetricsCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
