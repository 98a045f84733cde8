"""The metrics TRL's DPOTrainer logs, from a packed batch: the same names, the same numbers.

    entropy, logits/chosen, logits/rejected, mean_token_accuracy    per completion token (its own pass's stats)
    rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen, logps/rejected
    num_tokens                                                      the tokens a padded batch would hold (p+c + p+r)

Each is gathered over ranks as TRL gathers it and appended to ``trainer._metrics[mode]``, which TRL's
``log`` averages. Cost: a few reductions and host reads per micro-batch, as TRL's.
"""

from __future__ import annotations

import torch

from ._logps import PairLogProbs
from ._losses import PairValues

__all__ = ["log_pair_metrics"]


def _token_mean(trainer, values: torch.Tensor, where: torch.Tensor) -> float:
    total = trainer.accelerator.gather_for_metrics(values[where].sum()).sum()
    count = trainer.accelerator.gather_for_metrics(where.sum()).sum()
    return (total / count).item() if count > 0 else 0.0


def log_pair_metrics(trainer, mode: str, inputs: dict, policy: PairLogProbs, values: PairValues) -> None:
    """Append this micro-batch's metrics to ``trainer._metrics[mode]`` (TRL's names and formulas)."""
    metrics, gather = trainer._metrics[mode], trainer.accelerator.gather
    targets = policy.sequence >= 0
    chosen, rejected = targets & (policy.sequence % 2 == 0), targets & (policy.sequence % 2 == 1)
    stats = policy.stats
    metrics["entropy"].append(_token_mean(trainer, stats["entropy"], targets))
    if mode == "train":
        tokens = trainer.accelerator.gather_for_metrics(inputs["pair_tokens"].sum()).sum().item()
        trainer._total_train_tokens += int(tokens) // trainer._tp_size
    metrics["num_tokens"] = [trainer._total_train_tokens]
    metrics["logits/chosen"].append(_token_mean(trainer, stats["mean_logits"], chosen))
    metrics["logits/rejected"].append(_token_mean(trainer, stats["mean_logits"], rejected))
    metrics["mean_token_accuracy"].append(_token_mean(trainer, stats["is_top1"], chosen))
    chosen_rewards = trainer.beta * (values.chosen - values.ref_chosen).detach()
    rejected_rewards = trainer.beta * (values.rejected - values.ref_rejected).detach()
    metrics["rewards/chosen"].append(gather(chosen_rewards).mean().item())
    metrics["rewards/rejected"].append(gather(rejected_rewards).mean().item())
    metrics["rewards/accuracies"].append(gather((chosen_rewards > rejected_rewards).float()).mean().item())
    metrics["rewards/margins"].append(gather(chosen_rewards - rejected_rewards).mean().item())
    metrics["logps/chosen"].append(gather(values.chosen.detach()).mean().item())
    metrics["logps/rejected"].append(gather(values.rejected.detach()).mean().item())
