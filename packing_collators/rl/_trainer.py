"""PackingGRPOTrainer and PackingRLOOTrainer: TRL's trainers with every scoring forward on one packed row.

    GRPOTrainer / RLOOTrainer (TRL >= 1.16)   prompts, generation, rewards, advantages, every loss type, metrics
      + PackedLogProbs                        the policy's, the reference's and the old policy's per-token
                                              log-probabilities (and entropies) from a flat row per micro-batch
      + share_prompt                          each prompt once for its group of completions
      + enable_packing, the checks            hybrids keep the row's sequences apart; probed before training

The loss, its gradients and the metrics equal TRL's padded trainer on the same completions (tests/rl): packing
changes which tokens a forward computes, not what TRL computes from them. Cost: a forward on the real tokens
only (no padding), with ``share_prompt`` each prompt once per group.
"""

from __future__ import annotations

from typing import Any

from .._validation import validate_flag
from ..loss import CheckedHeads
from ._logps import PackedLogProbs

try:
    from trl import GRPOTrainer, RLOOTrainer
except ImportError as error:  # pragma: no cover - trl is an optional dependency
    raise ImportError("PackingGRPOTrainer builds on TRL's GRPOTrainer: pip install 'trl>=1.16'.") from error

__all__ = ["PackingGRPOTrainer", "PackingRLOOTrainer"]


def _packing_setup(trainer, packing_probe: bool) -> None:
    """What both trainers do after TRL built them: the options checked, the models prepared, the checks added."""
    from .._compat import attn_implementation
    from .._model_unwrap import text_config, unwrap_model
    from ..models import SHARED_ATTENTION, enable_packing
    from ._checks import RLCheckCallback

    for model in (trainer.model, trainer.ref_model):
        if model is not None:
            enable_packing(unwrap_model(model))
    if trainer.share_prompt:
        implementation = attn_implementation(text_config(unwrap_model(trainer.model)))
        if getattr(trainer, "aux_loss_enabled", False):
            raise ValueError(
                f"share_prompt=True with the router's auxiliary loss: the shared row routes each prompt's tokens once, "
                f"where TRL's padded batch routes them with each completion, so the load-balancing loss would differ. "
                f"Pass share_prompt=False, or {type(trainer.args).__name__}(router_aux_loss_coef=0.0) to train without it."
            )
        if implementation not in SHARED_ATTENTION:
            raise ValueError(
                f"share_prompt=True needs an attention that reads a shared prompt's layout ({', '.join(SHARED_ATTENTION)}); "
                f"the model runs {implementation!r}, which would let a completion see its group's others. Load the "
                "model with attn_implementation='sdpa' (or 'packing_varlen' / 'packing_fa4'), or share_prompt=False."
            )
    trainer.add_callback(RLCheckCallback(trainer, probe=packing_probe))


class _PackingRL(PackedLogProbs):
    """What both trainers add to TRL's: the packing options (keyword-only, checked), the head cache, the setup."""

    def __init__(self, *args: Any, share_prompt: bool = False, packing_probe: bool = True, **kwargs: Any) -> None:
        self.share_prompt = validate_flag("share_prompt", share_prompt)
        packing_probe = validate_flag("packing_probe", packing_probe)
        super().__init__(*args, **kwargs)
        # TRL cast the heads' weights to float32 (cast_lm_head_to_fp32): the packed head projects as TRL's does
        self._heads = CheckedHeads(type(self).__name__, float32=bool(getattr(self.args, "cast_lm_head_to_fp32", False)))
        _packing_setup(self, packing_probe)

    def _generate_single_turn(self, *args: Any, **kwargs: Any):
        """TRL's generation, the policy decoding under the transformers implementation of its packed attention's
        kernel (``packing_fa4`` and ``packing_varlen`` read packed rows only; ``attention.decoding_attention``)."""
        from ..attention import decoding_attention

        with decoding_attention(self.model):
            return super()._generate_single_turn(*args, **kwargs)


class PackingGRPOTrainer(_PackingRL, GRPOTrainer):
    """TRL's ``GRPOTrainer`` scoring its completions on packed rows (see the module docstring).

    Takes what ``GRPOTrainer`` takes (``model``, ``reward_funcs``, ``args`` a ``GRPOConfig``, datasets,
    ``processing_class``, ``peft_config``, ...), and keyword-only:

    Args:
        share_prompt: lay each prompt once, its group's completions after it (the keys-apart layout of
            ``batch.SharedPromptLayout``); needs an attention that reads it (``sdpa``, ``eager``, ``packing_varlen``,
            ``packing_fa4``). Refused with the router's auxiliary loss (TRL routes each prompt once per completion).
        packing_probe: run the live equivalence probe on the policy (and the reference) before the first step.

    These options mean what they mean for PackingTrainer and PackingDPOTrainer. Generation is TRL's own (the same
    seed gives the same completions); with ``cast_lm_head_to_fp32`` the packed head projects in float32 outside
    autocast, as TRL's does; ``use_liger_kernel`` (TRL keeps Liger's layer kernels, not its fused loss) is probed with
    them in place. Vision-language batches are refused.
    """


class PackingRLOOTrainer(_PackingRL, RLOOTrainer):
    """TRL's ``RLOOTrainer`` scoring its completions on packed rows; options as :class:`PackingGRPOTrainer`'s."""
