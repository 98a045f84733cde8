"""PackingDPOTrainer's checks when training begins: the packed layout on the policy and the reference.

    first pairs -> their chosen and rejected sequences -> FlatteningCollator's row (the row training feeds)
      check_packing_support(policy, row) + the live probe          refused with the numbers if it mixes them
      the same for the reference model (its attention and layers must keep the sequences apart too)
      FlashAttention-4: its kernels compiled up to the longest sequence, before the first step

A preference row is a flat row of sequences, so the SFT probe measures what matters: no sequence sees
another. Cost: the probe's few forwards per model, once.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from .._compat import attn_implementation
from .._model_unwrap import probe_module, text_config, unwrap_model
from ..attention import FA4_ATTENTION, attention_kind, warm_up_attention
from ..checks import check_packing_support, probe_packing, refuse_failed_probe
from ..collate import FlatteningCollator

__all__ = ["PreferenceCheckCallback"]

logger = logging.getLogger(__name__)


def _autocast(args, model):
    import torch

    if not (args.bf16 or args.fp16):
        return None
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=torch.bfloat16 if args.bf16 else torch.float16)


class PreferenceCheckCallback(TrainerCallback):
    """Check the policy and the reference on the first pairs' packed row, probe both, warm FA4 up."""

    def __init__(self, trainer, *, probe: bool = True) -> None:
        self.trainer, self.probe, self.reports = trainer, probe, []

    def _check(self, model, batch, args) -> None:
        check_packing_support(model, batch, probe=False)
        if not self.probe:
            return
        report = probe_packing(probe_module(model), FlatteningCollator(), autocast=_autocast(args, model))
        logger.info("PackingDPOTrainer: %s", report.summary())
        self.reports.append(report)
        refuse_failed_probe(report, attention_kind(attn_implementation(text_config(model))))

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        trainer = self.trainer
        dataset = trainer.train_dataset
        pairs = [dataset[i] for i in range(min(4, len(dataset)))]
        sequences = [s for i, pair in enumerate(pairs) for s in trainer.data_collator.sequences(pair, i)]
        batch = FlatteningCollator()(sequences)
        models = [model] + ([trainer.ref_model] if trainer.ref_model is not None else [])
        for each in models:
            self._check(each, batch, args)
        longest = max(len(s["input_ids"]) for s in sequences) if sequences else 0
        for each in models:
            inner = unwrap_model(each)
            if attn_implementation(text_config(inner)) in ("flash_attention_4", FA4_ATTENTION) and longest:
                warm_up_attention(probe_module(each), max_length=max(longest, trainer.args.max_length or 0))
