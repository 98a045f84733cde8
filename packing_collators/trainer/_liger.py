"""Liger Kernel's fused linear cross-entropy under PackingTrainer: what keeps the loss the token mean.

At long context the logits are the memory wall (64k tokens x 152k vocabulary in float32
is 39 GB); Liger's fused loss (liger-kernel, Triton) computes the loss from the last hidden
states in chunks and never forms them. Liger replaces the causal LM's ``forward`` with its
``lce_forward``, either when ``TrainingArguments(use_liger_kernel=True)`` makes the Trainer
apply it (in ``train()``, after ``__init__``) or by hand (``apply_liger_kernel_to_llama()``
before the model is built, or ``_apply_liger_kernel_to_instance(model)``). Read in
liger-kernel 0.8.5's ``transformers/model/llama.py`` and ``loss_utils.py``:

    num_items_in_batch   taken from ``**kwargs``: the loss is sum / num_items_in_batch
                         (the token mean over the step, as unfused), else the micro-batch mean
    labels               shifted as transformers shifts them (pad one -100 at the end, drop
                         the first), so FlatteningCollator's -100 at each example start holds
    position_ids,        passed to the decoder with the other kwargs (cu_seq_lens_q/k ...),
    cu_seq_lens          so packed attention is unchanged; the loss ignores them

So PackingTrainer with Liger stays exact when the Trainer passes ``num_items_in_batch``:
it does when the model accepts loss kwargs (``model_accepts_loss_kwargs``, decided at
construction from the model's forward) and Liger's forward takes them. Refused before the
first step: a Liger forward the count would not reach (the loss would silently become the
mean of micro-batch means), ``loss_normalization="sequence"`` (it weighs each token by its
example from the logits, which the fused loss never forms; running unfused would bring the
memory wall back without a word), and DeepSpeed ZeRO-3 (Liger reads ``lm_head.weight``
outside ``lm_head``'s forward, so ZeRO-3 never gathers it: a size mismatch at the first
step, huggingface/trl#3368). Cost: a signature read when training begins.
"""

from __future__ import annotations

import inspect

from .._model_unwrap import unwrap_model

__all__ = ["check_liger_setup", "liger_forward"]


def liger_forward(model):
    """The function behind ``model.forward`` if it is Liger Kernel's (its fused loss), else None.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> liger_forward(LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
    ...                                            num_attention_heads=2, intermediate_size=8))) is None
    True
    """
    forward = getattr(unwrap_model(model), "forward", None)
    function = getattr(forward, "__func__", forward)
    return function if str(getattr(function, "__module__", "")).startswith("liger_kernel") else None


def _takes_num_items(function) -> bool:
    parameters = inspect.signature(function).parameters.values()
    return any(p.kind is p.VAR_KEYWORD or p.name == "num_items_in_batch" for p in parameters)


def check_liger_setup(trainer) -> None:
    """Raise a ValueError, before training, for a Liger set-up that would not give PackingTrainer's loss."""
    if trainer.model is None:
        return
    function = liger_forward(trainer.model)
    if function is None:
        return
    name = f"{function.__module__}.{function.__qualname__}"
    if trainer.loss_normalization == "sequence":
        raise ValueError(
            f"loss_normalization='sequence' weighs each token by its example, from the logits, and Liger's fused "
            f"linear cross-entropy ({name}) never forms them. Use loss_normalization='token' with Liger, or keep "
            "Liger's other kernels without its fused loss: TrainingArguments(use_liger_kernel=True, "
            "liger_kernel_config={'fused_linear_cross_entropy': False}) (or apply_liger_kernel_to_*(fused_linear_"
            "cross_entropy=False)); the logits then take their full memory."
        )
    if not (trainer.model_accepts_loss_kwargs and _takes_num_items(function)):
        why = "takes no num_items_in_batch" if not _takes_num_items(function) else "is never given num_items_in_batch"
        raise ValueError(
            f"Liger's fused loss ({name}) {why} (the Trainer passes it only when the model accepts loss kwargs: "
            f"model_accepts_loss_kwargs={trainer.model_accepts_loss_kwargs}), so each micro-batch's loss would be "
            "its own token mean and a step's loss the mean of those, not the mean over the step's tokens. Use a "
            "liger-kernel whose forward takes **kwargs (0.8.5 does), and a model class that accepts loss kwargs."
        )
    plugin = getattr(getattr(trainer, "accelerator", None), "state", None)
    plugin = getattr(plugin, "deepspeed_plugin", None)
    if getattr(trainer, "is_deepspeed_enabled", False) and getattr(plugin, "zero_stage", None) == 3:
        raise ValueError(
            f"Liger's fused loss ({name}) reads lm_head.weight outside lm_head's forward, which DeepSpeed ZeRO-3 "
            "keeps sharded (its gather hook never fires: a size mismatch at the first step, huggingface/trl#3368). "
            "Use ZeRO-2 or DDP with Liger, or ZeRO-3 without the fused loss "
            "(liger_kernel_config={'fused_linear_cross_entropy': False})."
        )
