"""Liger's fused loss under PackingTrainer, on CPU: the wiring and the refusals (Triton does not run here).

A stand-in for Liger's ``lce_forward`` (a function of a ``liger_kernel`` module that calls the
model's own forward, as Liger's computes the same loss fused) records the ``num_items_in_batch``
it is given, so the tests see what the Trainer passes to Liger's forward on a real run.
"""

from __future__ import annotations

from types import MethodType, SimpleNamespace

import numpy as np
import pytest
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import PackingTrainer
from packing_collators.trainer._liger import check_liger_setup, liger_forward

datasets = pytest.importorskip("datasets")
from transformers import LlamaForCausalLM  # noqa: E402

LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4]
LIGER_MODULE = "liger_kernel.transformers.model.llama"


def _liger_like(seen: list, *, with_kwargs: bool = True):
    if with_kwargs:
        def lce_forward(self, input_ids=None, position_ids=None, labels=None, **kwargs):  # Liger's order of these
            seen.append(kwargs.get("num_items_in_batch"))
            return LlamaForCausalLM.forward(self, input_ids=input_ids, position_ids=position_ids, labels=labels, **kwargs)
    else:
        def lce_forward(self, input_ids=None, labels=None, position_ids=None):
            return LlamaForCausalLM.forward(self, input_ids=input_ids, labels=labels, position_ids=position_ids)
    lce_forward.__module__ = LIGER_MODULE
    return lce_forward


def _trainer(tmp_path, model, **options):
    train = datasets.Dataset.from_list(random_examples(LENGTHS, seed=7, completion_only=True))
    return PackingTrainer(model=model, args=training_args(tmp_path, **options.pop("args", {})), train_dataset=train,
                          max_tokens_per_batch=24, packing_probe=False, **options)


def _losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_liger_applied_by_hand_gets_num_items_in_batch_and_the_same_losses(tmp_path):
    plain = _trainer(tmp_path / "plain", tiny_model("llama"))
    plain.train()
    seen, model = [], tiny_model("llama")
    model.forward = MethodType(_liger_like(seen), model)  # as _apply_liger_kernel_to_instance(model) does
    assert liger_forward(model) is not None
    fused = _trainer(tmp_path / "liger", model)
    fused.train()
    np.testing.assert_allclose(_losses(fused), _losses(plain), rtol=1e-5)
    training = [n for n in seen if n is not None]
    assert len(training) >= 8 and all(float(n) > 0 for n in training)  # 4 steps x 2 micro-batches, each given it


def test_use_liger_kernel_is_checked_after_the_trainer_applies_it(monkeypatch, tmp_path):
    import transformers.trainer

    def apply_liger_kernel(model, config):  # what transformers' apply_liger_kernel does to a Llama instance
        model.forward = MethodType(_liger_like([], with_kwargs=False), model)

    monkeypatch.setattr(transformers.trainer, "apply_liger_kernel", apply_liger_kernel)
    trainer = _trainer(tmp_path, tiny_model("llama"), args={"use_liger_kernel": True})
    with pytest.raises(ValueError, match="Liger's fused loss \\(liger_kernel.transformers.model.llama.*\\) takes no num_items_in_batch"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_liger_is_refused_where_the_trainer_would_not_pass_the_count(tmp_path):
    model = tiny_model("llama")
    model.forward = MethodType(_liger_like([]), model)
    trainer = _trainer(tmp_path, model)
    trainer.model_accepts_loss_kwargs = False  # e.g. a model class with accepts_loss_kwargs = False
    with pytest.raises(ValueError, match="is never given num_items_in_batch .*model_accepts_loss_kwargs=False"):
        trainer.get_train_dataloader()


def test_liger_with_the_sequence_loss_is_refused(tmp_path):
    model = tiny_model("llama")
    model.forward = MethodType(_liger_like([]), model)
    trainer = _trainer(tmp_path, model, loss_normalization="sequence")
    with pytest.raises(ValueError, match="loss_normalization='sequence' weighs each token by its example.*fused_linear_cross_entropy': False"):
        trainer.train()


def test_liger_under_zero3_is_refused():
    model = tiny_model("llama")
    model.forward = MethodType(_liger_like([]), model)
    state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3))
    trainer = SimpleNamespace(model=model, loss_normalization="token", model_accepts_loss_kwargs=True,
                              is_deepspeed_enabled=True, accelerator=SimpleNamespace(state=state))
    with pytest.raises(ValueError, match="which DeepSpeed ZeRO-3 keeps sharded"):
        check_liger_setup(trainer)
    state.deepspeed_plugin.zero_stage = 2
    check_liger_setup(trainer)  # ZeRO-2 keeps whole weights in the forward
