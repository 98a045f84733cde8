"""A trainer's micro-batch token budget: computed in one place, once per dataloader, handed on as a value.

    PackingTrainer(max_tokens_per_batch=...)  ->  TrainerBudget: the setting, checked at construction
    a dataloader's lengths, batch size, GPU   ->  TrainerBudget.plan  ->  PlannedBudget(tokens, longest)
        None          tokens = max(longest example, batch size x mean length)
        a number N    tokens = n x N                                  (n = sequence_parallel_size)
        "auto"        tokens = n x measure_token_budget(model, longest / n, ceiling=AUTO_CEILING): measured once,
                      the smallest over ranks
        training      memory_check: check_token_budget(model, tokens / n, longest / n), once per pair, on every rank
    PlannedBudget  ->  make_batch_sampler(lengths, tokens), the compile buckets, the FA4 warm-up: the same value

Only a model whole on one CUDA device is measured (:class:`GpuRun`, which the trainer fills: not a CPU model,
not FSDP/DeepSpeed shards, not a model split over devices). A refusal on one rank is raised on every rank, after all of
them took part in the collective, so no rank is left waiting.
Cost: two forward + backward passes per measured budget, once per (budget, longest).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import validate_positive_int

__all__ = ["AUTO_BUDGET", "GpuRun", "PlannedBudget", "TrainerBudget"]

logger = logging.getLogger(__name__)

AUTO_BUDGET = "auto"  # max_tokens_per_batch measured on the model's GPU
# "auto"'s largest budget per rank: a bigger micro-batch trains no faster, while the dry runs and the compile warm-up
# grow with it (measured: docs/benchmarks.md, the auto-budget row against TRL)
AUTO_CEILING = 262_144


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


@dataclass(frozen=True)
class GpuRun:
    """What a budget is measured on: the model whole on one CUDA device (None: it cannot be), the Trainer's
    autocast dtype, and the loss its steps compute (a trainer builds it: ``trainer/_gpu_run.py``)."""

    model: Any
    autocast_dtype: Any = None
    loss_implementation: str = "auto"


@dataclass(frozen=True)
class PlannedBudget:
    """A dataloader's token budget.

    Attributes:
        tokens: the micro-batch token budget (a sequence-parallel group's, ``n`` ranks' together).
        longest: the longest example a micro-batch holds, ``min(longest example, tokens)``.
    """

    tokens: int
    longest: int


class TrainerBudget:
    """PackingTrainer's token budget: the setting (checked here), ``"auto"`` measured once, and the
    ``(tokens, longest)`` pairs ``memory_check`` passed, so each is measured or checked once.

    >>> TrainerBudget(None, memory_check=True, sequence_parallel_size=1).plan(np.array([3, 5, 10]), 4, GpuRun(None))
    PlannedBudget(tokens=24, longest=10)
    >>> TrainerBudget(64, memory_check=True, sequence_parallel_size=2).plan(np.array([3, 5, 100]), 4, GpuRun(None))
    PlannedBudget(tokens=128, longest=100)
    >>> TrainerBudget(0, memory_check=True, sequence_parallel_size=1)
    Traceback (most recent call last):
    ...
    ValueError: max_tokens_per_batch must be a positive integer or None (derived from the batch size; or 'auto', measured on the GPU), got 0.
    """

    def __init__(self, max_tokens_per_batch, *, memory_check: bool, sequence_parallel_size: int) -> None:
        if max_tokens_per_batch != AUTO_BUDGET:
            validate_positive_int(
                "max_tokens_per_batch",
                max_tokens_per_batch,
                allow_none=True,
                none_means="derived from the batch size; or 'auto', measured on the GPU",
            )
        self.max_tokens_per_batch = max_tokens_per_batch
        self.memory_check = memory_check
        self.sequence_parallel_size = validate_positive_int("sequence_parallel_size", sequence_parallel_size)
        self._auto: int | None = None  # max_tokens_per_batch="auto", once measured (one rank's)
        self._checked: set[tuple[int, int]] = set()  # (tokens, longest) of one rank that passed the memory check

    def plan(self, lengths: np.ndarray, batch_size: int, gpu: GpuRun, *, training: bool = False) -> PlannedBudget:
        """The budget of a dataloader over ``lengths``; a training one is checked against the GPU (``memory_check``)."""
        tokens = self._tokens(lengths, batch_size, gpu)
        longest = int(min(lengths.max(), tokens)) if len(lengths) else 0
        if training and len(lengths):
            self._check(tokens, longest, gpu)
        return PlannedBudget(tokens, longest)

    def _tokens(self, lengths: np.ndarray, batch_size: int, gpu: GpuRun) -> int:
        n = self.sequence_parallel_size
        if self.max_tokens_per_batch == AUTO_BUDGET:
            return n * self._measured(-(-int(lengths.max()) // n) if len(lengths) else 1, gpu)
        if self.max_tokens_per_batch is not None:
            return n * self.max_tokens_per_batch
        if not len(lengths):
            return 1
        return max(int(lengths.max()), int(round(batch_size * float(lengths.mean()))))

    def _measured(self, longest: int, gpu: GpuRun) -> int:
        """``"auto"``: measure_token_budget for ``longest``, the smallest over ranks; measured once, by the first
        dataloader that asks (evaluation during training must not measure a step beside the optimizer's states)."""
        if self._auto is not None:
            return self._auto
        if gpu.model is None:
            raise ValueError(
                "max_tokens_per_batch='auto' measures the model's memory on its GPU, but the model is not whole "
                "on one CUDA device (on a CPU, sharded by FSDP/DeepSpeed, or split over devices). Pass a number "
                "of tokens instead."
            )
        from ..parallel import inner_attention
        from ._memory_budget import measure_token_budget

        def measure() -> int:
            with inner_attention(gpu.model):  # one rank's share, measured without the group's collectives
                budget = measure_token_budget(
                    gpu.model, longest=longest, autocast_dtype=gpu.autocast_dtype,
                    loss_implementation=gpu.loss_implementation, ceiling=AUTO_CEILING,
                )  # fmt: skip
            logger.info("PackingTrainer: max_tokens_per_batch='auto' on this rank: %s", budget.summary())
            return budget.max_tokens_per_batch

        self._auto = _agreed_over_ranks(
            measure,
            gpu.model,
            elsewhere=f"max_tokens_per_batch='auto': another rank could not fit one example of {longest} tokens "
            "on its GPU (its error says why).",
        )
        self._checked.add((self._auto, longest))  # measured: no need to check it again
        return self._auto

    def _check(self, tokens: int, longest: int, gpu: GpuRun) -> None:
        """``memory_check``: refuse a training budget that does not fit this GPU, before the first step."""
        n = self.sequence_parallel_size  # a rank holds 1/n of the group's row: checked as such, without Ulysses
        tokens, longest = tokens // n, -(-longest // n)
        if not self.memory_check or gpu.model is None or (tokens, longest) in self._checked:
            return
        from ..parallel import inner_attention
        from ._memory_budget import check_token_budget

        def check() -> int:
            with inner_attention(gpu.model):
                share = check_token_budget(
                    gpu.model, tokens, longest=longest, autocast_dtype=gpu.autocast_dtype,
                    loss_implementation=gpu.loss_implementation,
                )  # fmt: skip
            logger.info(
                "PackingTrainer: a step of %d tokens (examples of %d) peaks at %.1f%% of the GPU's memory",
                tokens,
                longest,
                100 * share,
            )
            return tokens

        _agreed_over_ranks(
            check,
            gpu.model,
            elsewhere=f"max_tokens_per_batch={tokens} does not fit another rank's GPU (its error says why).",
            hint=" memory_check=False (PackingTrainer, PackingDPOTrainer) skips this check.",
        )
        self._checked.add((tokens, longest))
