"""RL post-training (GRPO, RLOO) on packed rows: TRL's trainers, every log-probability from one flat row.

_rows.py     TRL's padded batch (prompts left, completions right) -> the row's sequences, and back
_logps.py    PackedLogProbs: the per-token log-probabilities (and entropies) TRL's loss reads, from one packed
             forward per micro-batch, each prompt once for its group with ``share_prompt``
_checks.py   the packed layout checked and probed on the policy and the reference before the first step
_trainer.py  PackingGRPOTrainer, PackingRLOOTrainer (TRL >= 1.16 underneath; load on first use)

Generation, rewards, advantages and every loss type are TRL's own code: only the forwards that score the
completions run packed. Built on batch/, collate/, loss/, models/, checks/ and trainer/.
"""

from .._lazy import lazy_names

__all__ = ["PackingGRPOTrainer", "PackingRLOOTrainer"]

__getattr__ = lazy_names(__name__, {"PackingGRPOTrainer": "._trainer", "PackingRLOOTrainer": "._trainer"})
