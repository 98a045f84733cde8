"""PackingTrainer's token budget against the GPU: ``max_tokens_per_batch="auto"`` and ``memory_check``.

    "auto"        TokenBudgets.measured: measure_token_budget(model, longest) on each rank -> the smallest over ranks
    memory_check  TokenBudgets.check: check_token_budget(model, budget, longest) on each rank -> refused on every rank

Only a model whole on one CUDA device is measured (not a CPU model, not FSDP/DeepSpeed
shards, not a model split over devices). A refusal on one rank is raised on every rank,
after all of them took part in the collective, so no rank is left waiting.
Cost: two forward + backward passes per measured budget, once per (budget, longest).
"""

from __future__ import annotations

import logging

from .._model_unwrap import probe_module

__all__ = ["TokenBudgets", "memory_model"]

logger = logging.getLogger(__name__)


def _agreed_over_ranks(measure, model, *, elsewhere: str, hint: str = "") -> int:
    """``measure()`` (a positive number of tokens) on this rank, then the smallest over ranks.

    Each rank measures its own GPU; a refusal (ValueError) on any rank is raised on every rank,
    after all of them took part in the collective (a rank that raised before it would leave
    the others waiting): this rank's own error, or ``elsewhere``; ``hint`` ends both.
    """
    try:
        tokens, error = measure(), None
    except ValueError as refused:
        tokens, error = 0, refused
    parameter = next(model.parameters())
    smallest = _smallest_over_ranks(tokens, parameter.device)
    if error is not None:
        raise ValueError(f"{error}{hint}") from error
    if smallest == 0:
        raise ValueError(f"{elsewhere}{hint}")
    return smallest


def _smallest_over_ranks(tokens: int, device) -> int:
    """The smallest of every rank's ``tokens`` under torch.distributed (each rank measured its own GPU)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tokens
    value = torch.tensor([tokens], device=device, dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def memory_model(trainer):
    """The model whose memory the budget is measured on, or None where it cannot be.

    That is a model whole on one CUDA device: not on a CPU, not sharded (FSDP, DeepSpeed),
    not split over several devices (model parallel, ``device_map``).
    """
    model = probe_module(trainer.model) if trainer.model is not None else None
    devices = {p.device for p in model.parameters()} if model is not None else set()
    split = (
        getattr(trainer, "is_fsdp_enabled", False)
        or getattr(trainer, "is_deepspeed_enabled", False)
        or getattr(trainer, "is_model_parallel", False)
        or len(devices) != 1
    )
    return None if split or next(iter(devices)).type != "cuda" else model


def _autocast_dtype(args):
    """The dtype the Trainer autocasts the forward to (``bf16`` / ``fp16``), or None."""
    import torch

    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None


class TokenBudgets:
    """PackingTrainer's token budgets against its GPU: ``"auto"`` measured once, and the (budget, longest)
    pairs ``memory_check`` passed, kept here (not on the trainer) so each is measured or checked once.

    ``trainer`` gives the model (``trainer._memory_model()``), ``args``, ``memory_check`` and
    ``sequence_parallel_size``.
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.auto: int | None = None  # max_tokens_per_batch="auto", once measured
        self.checked: set[tuple[int, int]] = set()  # (budget, longest) that passed the memory check

    def loss_implementation(self) -> str:
        """The loss the dry runs compute: the trainer's (the full logits where its set-up needs them)."""
        from ._head_loss import why_full_logits

        trainer = self.trainer
        return "full" if why_full_logits(trainer) else trainer._head_loss.implementation

    def measured(self, longest: int) -> int:
        """``max_tokens_per_batch="auto"``: measure_token_budget for ``longest``, the smallest over ranks.

        Measured once, by the first dataloader that asks (training, or an evaluation before
        it), and kept: evaluation during training must not measure a training step beside the
        optimizer's real states.
        """
        if self.auto is not None:
            return self.auto
        model = self.trainer._memory_model()
        if model is None:
            raise ValueError(
                "max_tokens_per_batch='auto' measures the model's memory on its GPU, but the model is not whole "
                "on one CUDA device (on a CPU, sharded by FSDP/DeepSpeed, or split over devices). Pass a number "
                "of tokens instead."
            )
        from ..parallel import inner_attention
        from ._memory_budget import measure_token_budget

        autocast_dtype = _autocast_dtype(self.trainer.args)

        def measure() -> int:
            with inner_attention(model):  # one rank's share, measured without the group's collectives
                budget = measure_token_budget(
                    model, longest=longest, autocast_dtype=autocast_dtype, loss_implementation=self.loss_implementation()
                )
            logger.info("PackingTrainer: max_tokens_per_batch='auto' on this rank: %s", budget.summary())
            return budget.max_tokens_per_batch

        self.auto = _agreed_over_ranks(
            measure,
            model,
            elsewhere=f"max_tokens_per_batch='auto': another rank could not fit one example of {longest} tokens "
            "on its GPU (its error says why).",
        )
        self.checked.add((self.auto, longest))  # measured: no need to check it again
        return self.auto

    def check(self, budget: int, longest: int) -> None:
        """``memory_check``: refuse a training budget that does not fit this GPU, before the first step."""
        trainer = self.trainer
        model = trainer._memory_model() if trainer.memory_check else None
        n = trainer.sequence_parallel_size  # a rank holds 1/n of the group's row: checked as such, without Ulysses
        budget, longest = budget // n, -(-longest // n)
        if model is None or (budget, longest) in self.checked:
            return
        from ..parallel import inner_attention
        from ._memory_budget import check_token_budget

        autocast_dtype = _autocast_dtype(trainer.args)

        def check() -> int:
            with inner_attention(model):
                share = check_token_budget(
                    model, budget, longest=longest, autocast_dtype=autocast_dtype,
                    loss_implementation=self.loss_implementation(),
                )
            logger.info(
                "PackingTrainer: a step of %d tokens (examples of %d) peaks at %.1f%% of the GPU's memory",
                budget,
                longest,
                100 * share,
            )
            return budget

        _agreed_over_ranks(
            check,
            model,
            elsewhere=f"max_tokens_per_batch={budget} does not fit another rank's GPU (its error says why).",
            hint=" PackingTrainer(memory_check=False) skips this check.",
        )
        self.checked.add((budget, longest))
