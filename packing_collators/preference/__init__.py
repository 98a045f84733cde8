"""Preference training (DPO) on packed rows: pairs laid end to end, exact against TRL's DPOTrainer.

_collator.py  PreferenceCollator: a micro-batch of pairs -> one row of sequences, their bookkeeping
_logps.py     pair_log_probs: each sequence's completion log-probability from one packed forward
_losses.py    PreferenceLoss: DPOConfig's loss types from the sequences' log-probabilities
_metrics.py   the metrics TRL logs (rewards/*, logps/*, logits/*, entropy, token accuracy)
_checks.py    the packed layout checked and probed on the policy and the reference
_loader.py    micro-batches of whole pairs filling a token budget
_trainer.py   PackingDPOTrainer (TRL >= 1.16's DPOTrainer underneath; loads on first use)

Built on collate/, loss/, models/, checks/, attention/ and sampler/.
"""

from ._collator import PreferenceCollator
from ._losses import LOSS_TYPES, PreferenceLoss

__all__ = ["LOSS_TYPES", "PackingDPOTrainer", "PreferenceCollator", "PreferenceLoss"]


def __getattr__(name: str):
    if name == "PackingDPOTrainer":  # imports TRL and transformers' Trainer
        from ._trainer import PackingDPOTrainer

        return PackingDPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
