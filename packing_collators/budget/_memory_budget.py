"""A micro-batch token budget from the GPU's memory, measured on the model (no guessing ``max_tokens_per_batch``).

Peak memory grows about linearly with a packed micro-batch's tokens (``_token_budget.py`` draws
that line and fits the budget under it). The measurements are dry runs on flat batches of the
longest example: each two forward + backward passes, with the optimizer's states (AdamW: two per
parameter, made at the first step) made between them, as training runs its first two steps: the
states split the allocator's blocks, and a step that fits once on a fresh allocator can still run
out of memory at the second step. The states' bytes are added from the parameter count. An
example that does not fit alone is refused before training with the numbers and the fix;
:func:`check_token_budget` runs the same dry run at a budget the user chose and refuses it the same
way (``PackingTrainer`` does so before the first step).

What it measures on a GPU, and how training at the budget fares: docs/trainer.md ("A token budget
from the GPU's memory"). Cost: two passes at ``longest``, ``2 * longest`` and the budget (up to seven
more when it shrinks or a size runs out of memory), and the kernels they compile; each pass's time
grows with its tokens, which ``ceiling`` bounds. Since the budget fills the card, the dry runs and
training run on expandable segments of CUDA's allocator (``_allocator.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._gpu_memory import usable_gpu_bytes
from .._model_unwrap import text_config
from .._validation import validate_positive_int
from ._allocator import avoid_fragmentation
from ._token_budget import TokenBudget, fit_token_budget

if TYPE_CHECKING:  # loss/ imports torch; this module is imported with the package, before torch is needed
    from ..loss import LossImplementation

__all__ = ["check_token_budget", "measure_token_budget"]

_GIB = 1 << 30
OPTIMIZER_STATES_PER_PARAMETER = 2  # AdamW: exp_avg and exp_avg_sq, in the parameters' dtype


def _peak_bytes(model, tokens: int, longest: int, states_per_parameter: int = 0, autocast_dtype=None, loss=None) -> int | None:
    """Peak CUDA memory of a training step on ``tokens`` tokens of examples of ``longest``, flattened (None: OOM).

    Two forward + backward passes, as training runs its first two steps: between them each
    trainable parameter gets ``states_per_parameter`` tensors of its shape (AdamW's states,
    created at the first step while the gradients still exist), then the gradients are freed.
    The second pass meets the allocator's blocks as the first left them, so a budget that
    fits one pass on a fresh allocator but not a real second step is caught here. The states'
    bytes are left out of the returned peak: the caller adds them from the parameter count.
    ``autocast_dtype`` runs the forwards under autocast, as the Trainer does with ``bf16=True``
    (float32 weights, bf16 activations: what a flash kernel needs, and what training holds).
    ``loss`` (``batch -> loss``, :func:`packing_collators.loss.training_loss`) is the training loss, a chunk
    of tokens at a time where the model allows it, as training computes it; default the model's own.
    """
    import torch

    from ..collate import FlatteningCollator

    loss = loss or (lambda inputs: model(**inputs).loss)
    parameter = next(model.parameters())
    vocab = int(text_config(model).vocab_size)
    lengths = [longest] * (tokens // longest) + ([tokens % longest] if tokens % longest else [])
    generator = torch.Generator().manual_seed(0)
    batch = FlatteningCollator()([{"input_ids": torch.randint(0, vocab, (n,), generator=generator)} for n in lengths])
    batch = {k: v.to(parameter.device) if hasattr(v, "to") else v for k, v in batch.items()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    states: list = []
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(parameter.device)
    torch.cuda.reset_peak_memory_stats(parameter.device)

    def step(inputs: dict) -> None:  # the forward under the Trainer's autocast, the backward outside, as accelerate
        with torch.autocast(parameter.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            value = loss(inputs)
        value.backward()

    try:
        step(batch)
        if states_per_parameter:
            states = [torch.empty_like(p) for p in trainable for _ in range(states_per_parameter)]
            model.zero_grad(set_to_none=True)
            step(batch)
        torch.cuda.synchronize(parameter.device)
        return int(torch.cuda.max_memory_allocated(parameter.device)) - sum(
            t.numel() * t.element_size() for t in states
        )
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        del batch, states
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def _on_gpu(model, caller: str, optimizer_states_per_parameter: int | None) -> tuple[int, int, int]:
    """(optimizer states per parameter, their bytes, the GPU bytes this process may use) for a model on a CUDA device."""

    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cuda":
        raise ValueError(
            f"{caller} measures GPU memory: move the model to a CUDA device first "
            f"(its parameters are on {None if parameter is None else parameter.device})."
        )
    states = (
        OPTIMIZER_STATES_PER_PARAMETER if optimizer_states_per_parameter is None else optimizer_states_per_parameter
    )
    optimizer_bytes = states * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return states, optimizer_bytes, usable_gpu_bytes(parameter.device)


def measure_token_budget(
    model,
    *,
    longest: int,
    memory_fraction: float = 0.9,
    optimizer_states_per_parameter: int | None = None,
    autocast_dtype=None,
    loss_implementation: LossImplementation = "auto",
    ceiling: int | None = None,
) -> TokenBudget:
    """Measure ``model``'s memory per packed token on its GPU and return the largest safe budget.

    Args:
        model: a transformers causal LM on a CUDA device, with the attention, dtype and gradient
            checkpointing it will train with (a varlen kernel: memory about linear in tokens).
        longest: the longest example the sampler may batch (its length is refused if it cannot fit).
        memory_fraction: the share of the GPU's memory the budget may plan to use (0.9 leaves room
            for the allocator's fragmentation and the data loader's pinned buffers).
        optimizer_states_per_parameter: optimizer states to add per parameter (AdamW: 2, the
            default; 0 when the optimizer already holds its states on this GPU).
        autocast_dtype: the dtype training autocasts to (``torch.bfloat16`` for a Trainer with
            ``bf16=True``), or None (default) for none: the dry runs then hold what training holds.
        loss_implementation: the training loss the dry runs compute, as ``PackingTrainer``'s option:
            ``"auto"`` (a chunk of tokens at a time where the model's head allows it: no full logits,
            so more tokens fit), ``"chunked"`` or ``"full"`` (the model's own full-logit loss).
        ceiling: the largest budget to return, and to dry-run (None, default: as many tokens as fit);
            ``PackingTrainer``'s ``"auto"`` passes 262,144 (``TokenBudget.ceiling`` says when it set the budget).

    The dry runs are :func:`fit_token_budget`'s, each two forward + backward passes with the
    optimizer's states made between them (no optimizer step). Raises a ValueError before
    training, with the measured numbers and the fix, when one example of ``longest`` tokens
    cannot fit. The model's mode and weights are left as they were and its gradients freed.
    """
    validate_positive_int("longest", longest)
    states, optimizer_bytes, total = _on_gpu(model, "measure_token_budget", optimizer_states_per_parameter)
    avoid_fragmentation(next(model.parameters()).device)  # the budget fills the card: see _allocator.py
    was_training = model.training
    model.train()
    try:
        from ..loss import training_loss

        loss = training_loss(model, loss_implementation)
        return fit_token_budget(
            lambda tokens: _peak_bytes(model, tokens, longest, states, autocast_dtype, loss),
            longest=longest,
            total_bytes=total,
            optimizer_bytes=optimizer_bytes,
            memory_fraction=memory_fraction,
            ceiling=ceiling,
        )
    finally:
        model.train(was_training)


def check_token_budget(
    model,
    max_tokens_per_batch: int,
    *,
    longest: int,
    memory_fraction: float = 0.9,
    optimizer_states_per_parameter: int | None = None,
    autocast_dtype=None,
    loss_implementation: LossImplementation = "auto",
) -> float:
    """Run one training step's worth of memory at ``max_tokens_per_batch`` and refuse it if it does not fit.

    The dry run is :func:`measure_token_budget`'s (two passes on flat batches of examples of
    ``longest`` tokens, the optimizer's states made between them, no optimizer step, the loss as
    ``loss_implementation`` computes it). Returns
    the step's peak, optimizer states included, as a share of the GPU's memory. Raises a
    ValueError before training, with the numbers that show why, when the step runs out of
    memory or its peak passes ``memory_fraction`` of the card. Arguments as in
    :func:`measure_token_budget`.
    """
    validate_positive_int("max_tokens_per_batch", max_tokens_per_batch)
    validate_positive_int("longest", longest)
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}.")
    longest = min(longest, max_tokens_per_batch)
    states, optimizer_bytes, total = _on_gpu(model, "check_token_budget", optimizer_states_per_parameter)
    was_training = model.training
    model.train()
    try:
        from ..loss import training_loss

        peak = _peak_bytes(model, max_tokens_per_batch, longest, states, autocast_dtype, training_loss(model, loss_implementation))
    finally:
        model.train(was_training)
    return _share_or_refuse(peak, max_tokens_per_batch, longest, optimizer_bytes, total, memory_fraction)


def _share_or_refuse(
    peak: int | None, tokens: int, longest: int, optimizer_bytes: int, total: int, memory_fraction: float
) -> float:
    """The step's share of the card, or the ValueError that says why ``tokens`` does not fit.

    >>> _share_or_refuse(60 << 30, 131072, 8192, 4 << 30, 80 << 30, 0.9)
    0.8
    >>> _share_or_refuse(None, 262144, 8192, 4 << 30, 80 << 30, 0.9)
    Traceback (most recent call last):
    ...
    ValueError: max_tokens_per_batch=262144 does not fit this GPU (80.00 GiB): a training step on 262144 tokens (examples of 8192) ran out of memory. Lower max_tokens_per_batch (measure_token_budget(model, longest=8192) measures the largest that fits, and PackingTrainer(max_tokens_per_batch='auto') uses it), turn on gradient checkpointing, or use a GPU with more memory.
    """
    why = "ran out of memory"
    if peak is not None:
        share = (peak + optimizer_bytes) / total
        if share <= memory_fraction:
            return share
        why = (
            f"peaks at {peak / _GIB:.2f} GiB plus {optimizer_bytes / _GIB:.2f} GiB of optimizer states, "
            f"{share:.1%} of the card, over memory_fraction={memory_fraction:.0%}"
        )
    raise ValueError(
        f"max_tokens_per_batch={tokens} does not fit this GPU ({total / _GIB:.2f} GiB): a training step on {tokens} "
        f"tokens (examples of {longest}) {why}. Lower max_tokens_per_batch (measure_token_budget(model, "
        f"longest={longest}) measures the largest that fits, and PackingTrainer(max_tokens_per_batch='auto') uses "
        "it), turn on gradient checkpointing, or use a GPU with more memory."
    )
