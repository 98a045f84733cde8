"""PEFT and enable_packing, in either order: LoRA and ``modules_to_save`` train exactly (the copy PEFT makes of a
saved module is run, per example, and trained); prompt and prefix tuning are refused by name. Tiny float32 models
on the CPU.
"""

from __future__ import annotations

import pytest
import torch
from _hybrids import HYBRIDS, examples_for, tiny_hybrid
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import FlatteningCollator, PackingTrainer, check_packing_support, enable_packing

peft = pytest.importorskip("peft")

LORA_TARGETS = {"qwen3_5_text": ["gate_proj"], "lfm2": ["w1"], "nemotron_h": ["lm_head"]}
# LFM2's short convolution is named conv and holds a Conv1d named conv: PEFT's ["conv"] would wrap both (and
# freeze the copy's inner one, in either order); "layers.0.conv" names the layer alone.
SAVED = [(t, saved) for t, saved in (("qwen3_5_text", "linear_attn"), ("qwen3_5_text", "self_attn"),
                                     ("lfm2", "layers.0.conv"), ("nemotron_h", "mixer")) if t in HYBRIDS]  # fmt: skip


def _peft_model(model_type: str, saved: str, order: str):
    model = tiny_hybrid(model_type).train()
    if order == "enable_packing first":
        enable_packing(model)
    torch.manual_seed(0)
    config = peft.LoraConfig(target_modules=LORA_TARGETS[model_type], modules_to_save=[saved], init_lora_weights=False)
    model = peft.get_peft_model(model, config)
    return enable_packing(model) if order == "peft first" else model


def _weighted_sum(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.reshape(-1, logits.shape[-1])
    return (logits * torch.randn(logits.shape, generator=torch.Generator().manual_seed(1))).sum()


def _gradients(model) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("order", ["enable_packing first", "peft first"])
@pytest.mark.parametrize("model_type, saved", SAVED)
def test_modules_to_save_train_their_copy_as_each_example_alone(model_type, saved, order):
    # Before (enable_packing first): PEFT's copy of the module ran the original's forward, frozen: the copy got
    # no gradient (Nemotron-H's A_log never changed in training).
    model = _peft_model(model_type, saved, order)
    examples = examples_for(model)
    batch = FlatteningCollator()(examples)
    batch.pop("labels")
    _weighted_sum(model(**batch).logits).backward()
    packed = _gradients(model)
    alone = torch.cat([model(input_ids=torch.tensor([e["input_ids"]])).logits[0] for e in examples])
    _weighted_sum(alone).backward()
    expected = _gradients(model)
    copies = [n for n, p in model.named_parameters() if ".modules_to_save." in n and p.requires_grad]
    assert copies and all(expected[name].abs().sum() > 0 for name in copies if name in expected)
    assert all(name in expected for name in copies if ".experts." not in name)  # (a tiny MoE routes no token to some)
    assert packed.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(packed[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()) + 1e-7, msg=name)


@pytest.mark.skipif("qwen3_5_text" not in HYBRIDS, reason="this transformers has no Qwen3.5")
def test_packing_trainer_trains_the_copy_of_a_saved_module():
    """enable_packing, then PEFT with modules_to_save (the order docs/hybrid.md shows), then PackingTrainer."""
    model = _peft_model("qwen3_5_text", "linear_attn", "enable_packing first")
    saved = model.base_model.model.model.layers[0].linear_attn
    before = saved.modules_to_save["default"].A_log.detach().clone()
    frozen = saved.original_module.A_log.detach().clone()
    examples = [{**e, "labels": e["input_ids"]} for e in examples_for(model, (7, 12, 5, 9, 6, 11))]
    args = training_args("unused", max_steps=3, gradient_accumulation_steps=1, learning_rate=0.1, optim="sgd")
    datasets = pytest.importorskip("datasets")
    PackingTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(examples)).train()
    assert not torch.equal(saved.modules_to_save["default"].A_log, before)
    assert torch.equal(saved.original_module.A_log, frozen)


def _prompt_learning(kind: str):
    base = tiny_model("llama")
    base.config.use_cache = False
    configs = {"prompt": peft.PromptTuningConfig, "prefix": peft.PrefixTuningConfig}
    return peft.get_peft_model(base, configs[kind](task_type="CAUSAL_LM", num_virtual_tokens=4))


@pytest.mark.parametrize("kind, name", [("prompt", "PROMPT_TUNING"), ("prefix", "PREFIX_TUNING")])
def test_prompt_and_prefix_tuning_are_refused_by_name(tmp_path, kind, name):
    # Before: accepted by check_packing_support and PackingTrainer; packed against each example alone the
    # logits differed by 13.3 (prompt) and 16.1 (prefix), their magnitude about 10.
    model = _prompt_learning(kind)
    batch = FlatteningCollator()(random_examples([7, 12, 5]))
    message = rf"trains a {name} adapter, which packing cannot keep exact.*padded batches.*LoRA"
    with pytest.raises(ValueError, match=message):
        check_packing_support(model, batch)
    with pytest.raises(ValueError, match=message):
        enable_packing(model)
    with pytest.raises(ValueError, match=message):
        PackingTrainer(model=model, args=training_args(tmp_path), train_dataset=random_examples([7, 12, 5]))


def test_lora_alone_is_accepted():
    model = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(target_modules=["q_proj"]))
    model.config.use_cache = False
    assert check_packing_support(model) == "sdpa"
