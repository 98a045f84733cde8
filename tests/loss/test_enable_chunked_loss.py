"""enable_chunked_loss(model): a stock Trainer's losses, a chunk of tokens at a time, in one line."""

from __future__ import annotations

import copy

import pytest
import torch
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import FlatteningCollator, enable_chunked_loss

datasets = pytest.importorskip("datasets")

LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4]


def _stock_trainer_losses(tmp_path, chunked: bool):
    from transformers import Trainer

    model = tiny_model("llama")
    if chunked:
        assert enable_chunked_loss(model) is model
    args = training_args(tmp_path, max_steps=3, gradient_accumulation_steps=2, learning_rate=1e-2)
    train = datasets.Dataset.from_list(random_examples(LENGTHS * 2, seed=3, completion_only=True))
    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=FlatteningCollator())
    trainer.train()
    assert trainer.model_accepts_loss_kwargs  # num_items_in_batch reaches the chunked loss: the token mean
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_a_stock_trainer_logs_the_same_losses(tmp_path):
    assert _stock_trainer_losses(tmp_path / "c", True) == pytest.approx(_stock_trainer_losses(tmp_path / "f", False))


def test_training_calls_return_no_logits_and_eval_calls_the_models_own():
    model = enable_chunked_loss(tiny_model("llama"))
    batch = FlatteningCollator()(random_examples([6, 9, 4], seed=1))
    out = model(**batch)
    assert out.logits.shape == (1, 19, 0) and out.loss.requires_grad
    model.eval()
    full = model(**batch)
    assert full.logits.shape == (1, 19, 128) and float(full.loss) == pytest.approx(float(out.loss), rel=1e-6)
    enable_chunked_loss(model, eval_logits=False)  # again: the method stays, the option changes
    assert model(**batch).logits.shape == (1, 19, 0)


def test_a_deep_copy_computes_with_its_own_weights():
    model = enable_chunked_loss(tiny_model("llama"))
    copied = copy.deepcopy(model)
    with torch.no_grad():
        copied.lm_head.weight.mul_(2.0)
    batch = FlatteningCollator()(random_examples([6, 9, 4], seed=1))
    fresh = tiny_model("llama")
    fresh.load_state_dict(copied.state_dict())
    assert float(copied(**batch).loss) == pytest.approx(float(fresh(**batch).loss), rel=1e-6)
    assert float(copied(**batch).loss) != pytest.approx(float(model(**batch).loss), rel=1e-3)
    assert copied.forward.__self__ is copied


def test_a_model_whose_head_is_not_described_is_refused():
    model = tiny_model("llama")
    model.config.final_logit_softcapping = 5.0  # a soft cap the Llama forward never applies
    with pytest.raises(ValueError, match="its logits differ from its head's projection"):
        enable_chunked_loss(model)


def test_return_dict_false_returns_the_models_tuple_with_the_chunked_loss():
    model = tiny_model("llama")
    batch = FlatteningCollator()(random_examples([6, 9, 4]))
    full = model(**batch).loss
    out = enable_chunked_loss(model).train()(**batch, return_dict=False)
    assert isinstance(out, tuple) and out[1].shape[-1] == 0  # (loss, empty logits, ...) as the model's tuple orders
    torch.testing.assert_close(out[0], full)
