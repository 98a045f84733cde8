"""The preference losses of TRL's ``DPOConfig``, as functions of each sequence's log-probabilities.

    logratio  = policy logp - reference logp                    chosen and rejected, (B,) each
    score     = f'(ratio) of the f-divergence (reverse KL: the logratio itself)
    delta     = chosen score - rejected score
    loss      = sum over loss_type of weight * mean over pairs of per_pair(loss_type)

Every ``loss_type`` TRL 1.16 offers is one of these functions: sigmoid (DPO), hinge, ipo and
sigmoid_norm (scores per completion token), exo_pair, nca_pair, robust, bco_pair, sppo_hard, aot and
aot_unpaired (sorted over the batch), apo_zero, apo_down, discopop, sft (the chosen completions' mean
token log-probability). They are written from the papers' formulas as TRL states them, and tested equal
to TRL's ``DPOTrainer`` (tests/preference). Cost: a few vector ops over the batch's pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["LOSS_TYPES", "PairValues", "PreferenceLoss"]

LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)  # fmt: skip
F_DIVERGENCE_LOSSES = {"sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft"}


@dataclass
class PairValues:
    """What the losses read: (B,) log-probabilities, (B,) completion lengths, and the chosen targets' mean logp."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: torch.Tensor
    ref_rejected: torch.Tensor
    chosen_lengths: torch.Tensor
    rejected_lengths: torch.Tensor
    sft: torch.Tensor  # -mean log p over the chosen completions' tokens (the "sft" loss)
    weights: torch.Tensor | None = None  # (B,) each pair's WPO weight (use_weighting), without gradients


@dataclass(frozen=True)
class PreferenceLoss:
    """``DPOConfig``'s loss options (``loss_type`` a list, with ``loss_weights``)."""

    beta: float = 0.1
    loss_types: tuple[str, ...] = ("sigmoid",)
    loss_weights: tuple[float, ...] | None = None
    label_smoothing: float = 0.0
    f_divergence_type: str = "reverse_kl"
    f_alpha_divergence_coef: float = 1.0
    discopop_tau: float = 0.05

    @classmethod
    def from_config(cls, args) -> PreferenceLoss:
        loss_types = args.loss_type if isinstance(args.loss_type, (list, tuple)) else [args.loss_type]
        unknown = [t for t in loss_types if t not in LOSS_TYPES]
        if unknown:
            raise ValueError(f"loss_type {unknown} is not one of {list(LOSS_TYPES)}.")
        return cls(
            float(args.beta), tuple(loss_types), tuple(args.loss_weights) if args.loss_weights else None,
            float(args.label_smoothing), str(getattr(args, "f_divergence_type", "reverse_kl")),
            float(getattr(args, "f_alpha_divergence_coef", 1.0)), float(getattr(args, "discopop_tau", 0.05)),
        )  # fmt: skip

    def scores(self, logratios: torch.Tensor) -> torch.Tensor:
        """f'(ratio) for the f-divergence: what the margin compares."""
        kind = self.f_divergence_type
        if kind == "reverse_kl" or (kind == "alpha_divergence" and abs(self.f_alpha_divergence_coef - 1.0) < 1e-6):
            return logratios
        if kind == "forward_kl":
            return 1 - torch.exp(-logratios)
        if kind == "js_divergence":
            return math.log(2) + F.logsigmoid(logratios)
        if kind == "alpha_divergence":
            a = self.f_alpha_divergence_coef
            clamp = {torch.float16: 11.0}.get(logratios.dtype, 80.0)
            t = torch.clamp(((a - 1.0) * logratios).float(), max=clamp)
            return (torch.exp(t) - 1.0).to(logratios.dtype) / (a - 1.0)
        raise ValueError(f"Unknown f_divergence_type: {kind}")

    def __call__(self, v: PairValues) -> torch.Tensor:
        """The loss of a batch of pairs: sum over loss types of weight * mean over pairs."""
        weights = self.loss_weights or (1.0,) * len(self.loss_types)
        total = 0.0
        for loss_type, weight in zip(self.loss_types, weights):
            per_pair = _per_pair(self, loss_type, v)
            total = total + (per_pair if v.weights is None else per_pair * v.weights).mean() * weight
        return total


def _sigmoid_losses(o: PreferenceLoss, loss_type: str, delta: torch.Tensor, v: PairValues):
    b, eps = o.beta, o.label_smoothing
    if loss_type == "sigmoid":
        return -F.logsigmoid(b * delta)
    if loss_type == "hinge":
        return torch.relu(1 - b * delta)
    if loss_type == "robust":
        return (-(1 - eps) * F.logsigmoid(b * delta) + eps * F.logsigmoid(-b * delta)) / (1 - 2 * eps)
    if loss_type == "exo_pair":
        epsilon = torch.tensor(eps, device=delta.device)
        win, lose = torch.sigmoid(b * delta), torch.sigmoid(-b * delta)
        return win * (F.logsigmoid(b * delta) - torch.log1p(-epsilon)) + lose * (
            F.logsigmoid(-b * delta) - torch.log(epsilon)
        )
    if loss_type == "discopop":
        logits = delta * b
        mix = torch.sigmoid(logits / o.discopop_tau)
        return -F.logsigmoid(logits) * (1 - mix) + torch.exp(-logits) * mix
    return None


def _per_pair(o: PreferenceLoss, loss_type: str, v: PairValues) -> torch.Tensor:
    """(B,) loss of each pair for one ``loss_type`` (``sft``: its batch mean, expanded)."""
    chosen_ratio, rejected_ratio = v.chosen - v.ref_chosen, v.rejected - v.ref_rejected
    chosen_score, rejected_score = o.scores(chosen_ratio), o.scores(rejected_ratio)
    found = _sigmoid_losses(o, loss_type, chosen_score - rejected_score, v)
    if found is not None:
        return found
    b, eps = o.beta, o.label_smoothing
    if loss_type in ("ipo", "sigmoid_norm"):
        delta = chosen_score / v.chosen_lengths.clamp(min=1) - rejected_score / v.rejected_lengths.clamp(min=1)
        return (delta - 1 / (2 * b)) ** 2 if loss_type == "ipo" else -F.logsigmoid(b * delta)
    if loss_type == "nca_pair":
        c, r = b * chosen_ratio, b * rejected_ratio
        return -F.logsigmoid(c) - 0.5 * F.logsigmoid(-c) - 0.5 * F.logsigmoid(-r)
    if loss_type == "bco_pair":
        return -F.logsigmoid(b * chosen_ratio) - F.logsigmoid(-b * rejected_ratio)
    if loss_type == "sppo_hard":
        return (chosen_ratio - 0.5 / b) ** 2 + (rejected_ratio + 0.5 / b) ** 2
    if loss_type in ("aot", "aot_unpaired"):
        if loss_type == "aot":
            delta = torch.sort(v.chosen - v.rejected)[0] - torch.sort(v.ref_chosen - v.ref_rejected)[0]
        else:
            delta = torch.sort(chosen_ratio)[0] - torch.sort(rejected_ratio)[0]
        return -F.logsigmoid(b * delta) * (1 - eps) - F.logsigmoid(-b * delta) * eps
    if loss_type == "apo_zero":
        return 1 - torch.sigmoid(b * chosen_ratio) + torch.sigmoid(b * rejected_ratio)
    if loss_type == "apo_down":
        return torch.sigmoid(b * chosen_ratio) + 1 - torch.sigmoid(b * (chosen_ratio - rejected_ratio))
    if loss_type == "sft":
        return v.sft.expand(v.chosen.shape[0])
    raise ValueError(f"Unknown loss type: {loss_type}")
