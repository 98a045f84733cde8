"""PackingDPOTrainer's checks when training begins: the packed layout on the policy and the reference.

    first pairs -> their chosen and rejected sequences -> FlatteningCollator's row (the row training feeds)
      check_packing_support(policy, row) + the live probe          refused with the numbers if it mixes them
      the same for the reference model (its attention and layers must keep the sequences apart too)
      FlashAttention-4: its kernels compiled up to the longest sequence, before the first step

A preference row is a flat row of sequences, so the SFT probe measures what matters: no sequence sees
another. The pairs checked are the two longest and the first ones. With ``share_prompt`` the shared layout
is measured on the policy too: those pairs' log-probabilities shared must equal the unshared ones (within 1e-5 of a sequence's log-probability in
float32, 1e-3 in bf16/fp16), and changing their chosen completions must leave the rejected ones exactly
as they were in float32, within that tolerance in half precision (FA4 in bf16 moved them by 5e-4 to
1.2e-3 of ~2,000 on an H100: the kernel rounds by the row's content); routed experts run per token. Cost: the probe's few forwards per model, four more with ``share_prompt``; once.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
from transformers import TrainerCallback

from .._compat import attn_implementation
from .._model_unwrap import probe_module, text_config
from .._rank_agreement import refuse_together
from ..attention import attention_kind
from ..checks import check_packing_support, probe_packing, refuse_failed_probe, refuse_shared_layout_change
from ..collate import FlatteningCollator
from ..trainer import training_autocast, warm_up_packed_attention

__all__ = ["PreferenceCheckCallback"]

logger = logging.getLogger(__name__)


class PreferenceCheckCallback(TrainerCallback):
    """Check the policy and the reference on the first pairs' packed row, probe both, warm FA4 up."""

    def __init__(self, trainer, *, probe: bool = True) -> None:
        self.trainer, self.probe, self.reports = trainer, probe, []

    def _check(self, model, batch, args) -> None:
        check_packing_support(model, batch, probe=False)
        if not self.probe:
            return
        report = probe_packing(probe_module(model), FlatteningCollator(), autocast=training_autocast(args, model))
        logger.info("PackingDPOTrainer: %s", report.summary())
        self.reports.append(report)
        refuse_failed_probe(report, attention_kind(attn_implementation(text_config(model))))

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        trainer = self.trainer
        dataset = trainer.train_dataset
        pairs = _probe_pairs(dataset, trainer.data_collator)
        sequences = [s for i, pair in enumerate(pairs) for s in trainer.data_collator.sequences(pair, i)]
        batch = FlatteningCollator()(sequences)
        models = [model] + ([trainer.ref_model] if trainer.ref_model is not None else [])

        def checks() -> None:
            for each in models:
                self._check(each, batch, args)
            if trainer.share_prompt and self.probe:
                self._check_shared(model, pairs, args)

        refuse_together(checks, next(probe_module(model).parameters()).device, "PackingDPOTrainer")  # every rank alike
        longest = max(len(s["input_ids"]) for s in sequences) if sequences else 0
        # the policy's warm-up compiles the kernels the frozen reference's forward reuses
        warm_up_packed_attention(model, max(longest, trainer.args.max_length or 0) if longest else 0, args)


    def _check_shared(self, model, pairs: list, args) -> None:
        """Refuse a model on which the shared-prompt layout changes a sequence's log-probability or leaks."""
        import torch

        from ..checks import probe_dtype, tokenwise_experts

        trainer = self.trainer
        module = probe_module(model)
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad(), training_autocast(args, module) or _null(), tokenwise_experts(module):
                found = [_pair_values(trainer, module, pairs, share) for share in (False, True)]
                changed = [dict(p, chosen_ids=[(t + 1) % 4 + 5 for t in p["chosen_ids"]]) for p in pairs]
                leaked = _pair_values(trainer, module, changed, True)
        finally:
            module.train(was_training)
        difference = max(float((a - b).abs().max()) for a, b in zip(found[0], found[1]))
        dtype = probe_dtype(training_autocast(args, module), next(module.parameters()))
        scale = max(1.0, float(found[0][1].abs().max()))
        allowed = (1e-5 if dtype in ("float32", "float64") else 1e-3) * scale  # of a sequence's log-probability
        leak = float((leaked[1] - found[1][1]).abs().max())
        exact = dtype in ("float32", "float64")  # half-precision kernels round by the row's content
        refuse_shared_layout_change("PackingDPOTrainer", difference, leak, exact=exact, allowed=allowed,
                                    moved="a chosen completion moves the rejected ones")  # fmt: skip


def _probe_pairs(dataset, collator, count: int = 4) -> list:
    """The pairs the checks run: the longest ones (a sliding window or a chunk the first pairs fit in would pass
    unseen) and the first ones; an IterableDataset's first ``count`` (it cannot be read ahead)."""
    first = list(itertools.islice(iter(dataset), count))
    if not hasattr(dataset, "__len__") or "prompt_ids" not in getattr(dataset, "column_names", ()):
        return first
    from ._loader import pair_lengths

    longest = np.argsort(-pair_lengths(dataset, collator), kind="stable")[: count // 2]
    chosen = list(dict.fromkeys([int(i) for i in longest] + list(range(min(count, len(dataset))))))[:count]
    return [dataset[i] for i in chosen]


def _null():
    import contextlib

    return contextlib.nullcontext()


def _pair_values(trainer, model, pairs: list, share: bool):
    """(chosen, rejected) log-probabilities of ``pairs`` laid out shared or not, on ``model``."""
    from ._collator import PreferenceCollator
    from ._logps import pair_log_probs

    collator = trainer.data_collator
    batch = PreferenceCollator(max_length=collator.max_length, truncation_mode=collator.truncation_mode,
                               share_prompt=share)(pairs)  # fmt: skip
    device = next(model.parameters()).device
    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
    found = pair_log_probs(model, trainer._with_mask(batch), trainer._head(model))
    return found.chosen.float(), found.rejected.float()
