"""GPT-2 declares no causal-LM loss type: transformers' Trainer counts its padded labels unshifted, each example's
first label (never a target) included; a packed row marks that label -100. Measured: the packed loss is the mean
over the scored tokens, the padded one that times targets / (targets + examples), and the run says so."""

from __future__ import annotations

import logging

import pytest
import torch
from _tiny_models import VOCAB, padded_batch, random_examples

from packing_collators import FlatteningCollator, PackingCheckCallback

datasets = pytest.importorskip("datasets")
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

LENGTHS = [9, 4, 15, 7]


def _first_loss(tmp_path, collator) -> float:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, attn_pdrop=0.0, resid_pdrop=0.0,
                                       embd_pdrop=0.0))  # fmt: skip
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, learning_rate=0.0,
                             logging_steps=1, report_to="none", use_cpu=True, save_strategy="no")  # fmt: skip
    examples = [{**e, "labels": list(e["input_ids"])} for e in random_examples(LENGTHS, seed=3)]
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(examples), data_collator=collator,
                      callbacks=[PackingCheckCallback()])  # fmt: skip
    trainer.train()
    return next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)


def test_gpt2s_packed_loss_is_the_target_mean_and_the_run_says_what_padding_counts(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        packed = _first_loss(tmp_path / "packed", FlatteningCollator())
    assert "GPT2LMHeadModel declares no causal-LM loss_type" in caplog.text
    padded = _first_loss(tmp_path / "padded", padded_batch)
    targets = sum(n - 1 for n in LENGTHS)
    assert padded / packed == pytest.approx(targets / (targets + len(LENGTHS)), rel=1e-4)
