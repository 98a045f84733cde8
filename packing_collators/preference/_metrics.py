"""The metrics TRL's DPOTrainer logs, from a packed batch: the same names, the same numbers.

    entropy, logits/chosen, logits/rejected, mean_token_accuracy    per completion token (its own pass's stats)
    rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen, logps/rejected
    num_tokens                                                      the tokens a padded batch would hold (p+c + p+r)

Each is gathered over ranks as TRL gathers it and appended to ``trainer._metrics[mode]``, which TRL's
``log`` averages; under a token budget (micro-batches of unequal pair counts) the per-pair ones pair by pair, so
that their logged mean is the pairs' mean, as TRL's equal batches give it. The per-token ones stay each
micro-batch's token mean: a budget's grouping moves them, as TRL's own batch size does. Cost: a few reductions
and host reads per micro-batch, as TRL's.
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
    # TRL's log averages the entries: one mean per micro-batch of its fixed pair count. Micro-batches of a token
    # budget hold unequal counts, so there each pair is an entry: the same per-pair mean over the logged pairs
    per_pair = mode == "train" and getattr(trainer, "max_tokens_per_batch", None) is not None  # eval: TRL's batches
    for name, value in (("rewards/chosen", chosen_rewards), ("rewards/rejected", rejected_rewards),
                        ("rewards/accuracies", (chosen_rewards > rejected_rewards).float()),
                        ("rewards/margins", chosen_rewards - rejected_rewards),
                        ("logps/chosen", values.chosen.detach()), ("logps/rejected", values.rejected.detach())):  # fmt: skip
        gathered = gather(value)
        if per_pair:
            metrics[name].extend(gathered.tolist())
        else:
            metrics[name].append(gathered.mean().item())
