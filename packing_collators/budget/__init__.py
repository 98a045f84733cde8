"""The micro-batch token budget: how many tokens a packed micro-batch may hold, planned once, handed on as a value.

_token_budget.py    TokenBudget: peak memory as a line in the tokens, fitted from two dry runs (no torch):
                    plan_token_budget, fit_token_budget
_memory_budget.py   measure_token_budget / check_token_budget: the dry runs on the model's GPU
_allocator.py       avoid_fragmentation: CUDA's expandable segments, so a budget that fits stays fitting
_trainer_budget.py  TrainerBudget: a dataloader's budget from the trainer's setting (None, a number, "auto"
                    measured once, memory_check), agreed over ranks; GpuRun, what it is measured on

A trainer fills a ``GpuRun`` from itself (``trainer/_gpu_run.py`` for PackingTrainer) and asks
``TrainerBudget.plan`` once per dataloader. Built on ``loss/`` (the step's loss), ``collate/`` (the dry runs'
rows) and ``parallel/`` (a sequence-parallel rank's share); the trainers are built on it.
"""

from ._allocator import avoid_fragmentation
from ._memory_budget import check_token_budget, measure_token_budget
from ._token_budget import TokenBudget, fit_token_budget, plan_token_budget
from ._trainer_budget import AUTO_BUDGET, GpuRun, PlannedBudget, TrainerBudget

__all__ = [
    "AUTO_BUDGET",
    "GpuRun",
    "PlannedBudget",
    "TokenBudget",
    "TrainerBudget",
    "avoid_fragmentation",
    "check_token_budget",
    "fit_token_budget",
    "measure_token_budget",
    "plan_token_budget",
]
