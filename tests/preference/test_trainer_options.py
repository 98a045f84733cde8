"""PackingDPOTrainer's options beside TRL's: a token budget of whole pairs, precomputed references, a LoRA
policy as its own reference, gradient checkpointing, and what it refuses."""

from __future__ import annotations

import copy

import pytest
import torch
from _pairs import text_pairs, word_tokenizer
from _tiny_models import tiny_model

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
if tuple(int(x) for x in trl.__version__.split(".")[:2]) < (1, 16):
    pytest.skip("PackingDPOTrainer builds on TRL >= 1.16's DPOTrainer", allow_module_level=True)

from test_dpo_vs_trl import _config, _logs  # noqa: E402

from packing_collators import PackingDPOTrainer  # noqa: E402


def _trainer(tmp_path, *, packed=True, model=None, reference="copy", iterable=False, **options):
    from trl import DPOTrainer

    model = model or tiny_model("llama", vocab_size=64, initializer_range=0.05)
    ref = copy.deepcopy(model).eval() if reference == "copy" else reference
    trainer_options = {k: options.pop(k) for k in ("max_tokens_per_batch", "peft_config", "share_prompt") if k in options}
    common = dict(model=model, ref_model=ref, args=_config(tmp_path / str(packed), **options),
                  train_dataset=_pairs(iterable), processing_class=word_tokenizer())  # fmt: skip
    if packed:
        return PackingDPOTrainer(**common, **trainer_options)
    return DPOTrainer(**common, **{k: v for k, v in trainer_options.items() if k == "peft_config"})


def _pairs(iterable: bool):
    pairs = datasets.Dataset.from_list(text_pairs(12, seed=1))
    return pairs.to_iterable_dataset() if iterable else pairs


def test_a_token_budget_packs_whole_pairs_and_never_goes_over(tmp_path):
    trainer = _trainer(tmp_path, max_tokens_per_batch=96, max_steps=3)
    widths = []
    trainer.model.register_forward_pre_hook(lambda m, a, k: widths.append(k["input_ids"].shape[1]), with_kwargs=True)
    logs = _logs(trainer)
    training = [w for w in widths if w > 40]
    assert len(logs) == 3 and training and max(training) <= 96
    plan = trainer._pair_sampler.plan()
    assert all(tokens <= 96 for tokens in plan.row_tokens) and plan.num_rows == len(trainer._pair_sampler)


@pytest.mark.parametrize("options", [
    {"precompute_ref_log_probs": True},
    {"gradient_checkpointing": True},
    {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]},
    {"f_divergence_type": "js_divergence"},
    {"ld_alpha": 0.5},
    {"precompute_ref_log_probs": True, "ld_alpha": 0.5},  # the reference weighted as the policy (15% off before)
])  # fmt: skip
def test_options_log_what_trl_logs(tmp_path, options):
    theirs = _logs(_trainer(tmp_path, packed=False, **options))
    ours = _logs(_trainer(tmp_path, **options))
    for mine, reference in zip(ours, theirs):
        for name in ("loss", "rewards/margins", "logps/chosen", "logps/rejected"):
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-6), (name, options)


def test_a_precomputed_reference_without_a_reference_model_is_the_policy_before_training(tmp_path):
    # TRL computes the reference log-probabilities with the policy itself before the first step (no copy kept)
    theirs = _logs(_trainer(tmp_path, packed=False, reference=None, precompute_ref_log_probs=True))
    ours = _logs(_trainer(tmp_path, reference=None, precompute_ref_log_probs=True))
    assert len(ours) == len(theirs) == 2 and ours[1]["rewards/margins"] != 0
    for mine, reference in zip(ours, theirs):
        for name in ("loss", "rewards/margins", "logps/chosen", "logps/rejected"):
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-6), name


def test_a_reference_precomputed_from_the_policy_runs_under_trls_default_bf16(tmp_path, monkeypatch):
    """bf16=True (float32 weights under autocast) and no reference model: TRL precomputes the reference with the
    policy under the training autocast, before accelerate has wrapped the policy's forward in it; so does this
    trainer (it ran in float32: step-1 margins 6e-5 where policy = reference). Each precomputing call is seen under
    autocast, and the logs equal TRL's to bf16 rounding."""
    from packing_collators.preference import _trainer as module

    seen, original = [], module.pair_log_probs

    def record(model, *args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return original(model, *args, **kwargs)

    theirs = _logs(_trainer(tmp_path, packed=False, reference=None, precompute_ref_log_probs=True, bf16=True))
    monkeypatch.setattr(module, "pair_log_probs", record)
    trainer = _trainer(tmp_path, reference=None, precompute_ref_log_probs=True, bf16=True)  # precomputes them all
    monkeypatch.undo()
    assert seen and all(seen)
    ours = _logs(trainer)
    for mine, reference in zip(ours, theirs, strict=True):
        assert abs(mine["rewards/margins"] - reference["rewards/margins"]) < 5e-4
        assert mine["loss"] == pytest.approx(reference["loss"], rel=1e-3)


def test_an_iterable_dataset_of_pairs_trains_as_trl(tmp_path):
    theirs = _logs(_trainer(tmp_path, packed=False, iterable=True))
    ours = _logs(_trainer(tmp_path, iterable=True))
    assert len(ours) == len(theirs) == 2
    for mine, reference in zip(ours, theirs):
        assert mine["loss"] == pytest.approx(reference["loss"], rel=1e-4, abs=1e-6)


def test_a_lora_policy_is_its_own_reference(tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    theirs = _logs(_trainer(tmp_path, packed=False, reference=None, peft_config=config, learning_rate=5e-2))
    ours = _logs(_trainer(tmp_path, reference=None, peft_config=config, learning_rate=5e-2))
    assert ours[1]["rewards/margins"] != 0  # the adapter moved the policy away from its reference
    for mine, reference in zip(ours, theirs):
        assert mine["rewards/margins"] == pytest.approx(reference["rewards/margins"], rel=1e-4, abs=1e-6)


def test_a_lora_policy_that_trains_its_head_logs_what_trl_logs(tmp_path):
    # modules_to_save=["lm_head"] wraps the head in PEFT's copy, which the chunked log-probabilities cannot compute:
    # the model's own full logits then, the same numbers (it was refused, naming an option this trainer lacks)
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, modules_to_save=["lm_head"])
    theirs = _logs(_trainer(tmp_path, packed=False, reference=None, peft_config=config, learning_rate=5e-2))
    ours = _logs(_trainer(tmp_path, reference=None, peft_config=config, learning_rate=5e-2))
    assert len(ours) == len(theirs) == 2 and ours[1]["rewards/margins"] != 0
    for mine, reference in zip(ours, theirs):
        for name in ("loss", "rewards/margins", "logps/chosen", "entropy", "mean_token_accuracy"):
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize("options", [
    {"use_weighting": True},
    {"use_weighting": True, "loss_type": ["sigmoid", "bco_pair"], "loss_weights": [1.0, 0.5]},  # (TRL fails with "sft")
    {"use_weighting": True, "loss_type": ["ipo"]},
])  # fmt: skip
def test_wpo_weighting_logs_what_trl_logs(tmp_path, options):
    """use_weighting (WPO): each pair's loss weighted by its completions' exp(mean log p - log sum p^2), the last
    from the chunked head's statistics (refused before: not implemented). A reference unlike the policy, so the
    weights and the losses they weigh are not those of a tie."""
    from trl import DPOTrainer

    found = {}
    for packed in (False, True):
        model, reference = _policy_and_other_reference(0.05)
        args = _config(tmp_path / str(packed), **options)
        common = dict(model=model, ref_model=reference, args=args, train_dataset=_pairs(False),
                      processing_class=word_tokenizer())  # fmt: skip
        found[packed] = _logs(PackingDPOTrainer(**common) if packed else DPOTrainer(**common))
    for mine, reference in zip(found[True], found[False], strict=True):
        for name in ("loss", "grad_norm", "rewards/margins", "logps/chosen"):
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-6), (name, options)


def test_wpo_with_sft_under_a_token_budget_and_a_leaking_attention_with_share_prompt_are_refused(tmp_path):
    with pytest.raises(ValueError, match="use_weighting=True with the 'sft' loss under max_tokens_per_batch"):
        _trainer(tmp_path, use_weighting=True, loss_type=["sigmoid", "sft"], max_tokens_per_batch=96)
    model = tiny_model("llama", vocab_size=64, initializer_range=0.05)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="share_prompt=True needs an attention"):
        _trainer(tmp_path, model=model, share_prompt=True)


def test_a_pair_over_the_budget_is_named_with_the_fixes_this_trainer_takes(tmp_path):
    trainer = _trainer(tmp_path, max_tokens_per_batch=30)
    with pytest.raises(ValueError, match=r"Pair \d+ has \d+ tokens, more than max_tokens_per_batch=30 .*lower DPOConfig.max_length") as error:
        trainer.get_train_dataloader()
    assert "overflow" not in str(error.value)  # PackingDPOTrainer takes no overflow option


def _policy_and_other_reference(scale: float):
    """A tiny policy and a reference unlike it (its weights moved by ``scale`` noise): rewards that are not all 0."""
    model = tiny_model("llama", vocab_size=64, initializer_range=0.05)
    reference = copy.deepcopy(model).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)))
    return model, reference


PER_PAIR_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
                    "logps/rejected")  # fmt: skip


@pytest.mark.parametrize("loss", [
    {"loss_type": ["sigmoid"]},
    {"loss_type": ["sft"]},  # TRL's token mean over the batch: the step's, however the budget grouped the pairs
    {"loss_type": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0]},
])  # fmt: skip
def test_under_a_token_budget_every_pair_of_a_step_weighs_the_same(tmp_path, loss):
    # one long pair and three short ones: the budget puts the long one alone and the short ones together, two
    # micro-batches accumulated into one step; each pair once weighed 1 / (pairs in its micro-batch), the long one 3x
    # a short one (1.79 vs TRL's 1.03 in the run), "sft" each micro-batch's token mean (grad_norm 3.26 vs
    # 2.69) and the logged pair metrics each micro-batch's mean (accuracies 0.5 vs 0.25). TRL's batch of the same
    # four pairs is the reference; a reference model unlike the policy, so the rewards are not all 0.
    from trl import DPOTrainer

    pairs = text_pairs(3, seed=1, prompt=(3, 5), completion=(1, 4)) + text_pairs(1, seed=2, prompt=(30, 31), completion=(8, 9))
    runs = {}
    for packed in (False, True):
        model, reference = _policy_and_other_reference(0.02)
        common = dict(model=model, ref_model=reference, train_dataset=datasets.Dataset.from_list(pairs),
                      processing_class=word_tokenizer())  # fmt: skip
        if packed:
            args = _config(tmp_path / "ours", max_steps=1, per_device_train_batch_size=1, gradient_accumulation_steps=2,
                           **loss)  # fmt: skip
            trainer = PackingDPOTrainer(**common, args=args, max_tokens_per_batch=80)  # pairs of 10, 11, 12, 76 tokens
        else:
            trainer = DPOTrainer(**common, args=_config(tmp_path / "trl", max_steps=1, per_device_train_batch_size=4,
                                                        **loss))  # fmt: skip
        runs[packed] = _logs(trainer)
        if packed:
            assert sorted(len(b) for b in trainer._pair_sampler) == [1, 3]  # the budget's two micro-batches
    (ours,), (theirs,) = runs[True], runs[False]
    assert theirs["rewards/accuracies"] not in (0.0, 1.0)
    for name in ("loss", "grad_norm", *PER_PAIR_METRICS):
        assert ours[name] == pytest.approx(theirs[name], rel=1e-4, abs=1e-6), name


def test_evaluation_under_a_token_budget_logs_what_trl_logs(tmp_path):
    """Evaluation runs TRL's eval batches (the budget plans training's), so its pair metrics are each batch's mean
    averaged, as TRL's: with a short last batch (5 pairs, batches of 4) they once were the pairs' mean instead."""
    from trl import DPOTrainer

    found = {}
    for packed in (False, True):
        model, reference = _policy_and_other_reference(0.05)
        common = dict(model=model, ref_model=reference, args=_config(tmp_path / str(packed), per_device_eval_batch_size=4),
                      train_dataset=_pairs(False), eval_dataset=datasets.Dataset.from_list(text_pairs(5, seed=3)),
                      processing_class=word_tokenizer())  # fmt: skip
        trainer = PackingDPOTrainer(**common, max_tokens_per_batch=200) if packed else DPOTrainer(**common)
        found[packed] = trainer.evaluate()
    for name in ("eval_loss", *(f"eval_{name}" for name in PER_PAIR_METRICS)):
        assert found[True][name] == pytest.approx(found[False][name], rel=1e-4, abs=1e-6), name


def test_a_loss_that_sorts_its_micro_batch_is_refused_under_a_token_budget(tmp_path):
    with pytest.raises(ValueError, match=r"loss_type \['aot'\] sorts each micro-batch's pairs .* max_tokens_per_batch=None"):
        _trainer(tmp_path, max_tokens_per_batch=96, loss_type=["sigmoid", "aot"], loss_weights=[1.0, 1.0])


@pytest.mark.parametrize("option, value, message", [
    ("max_tokens_per_batch", 0, "max_tokens_per_batch must be a positive integer or None"),
    ("max_tokens_per_batch", "all", "max_tokens_per_batch must be a positive integer or None"),
    ("memory_check", "yes", "memory_check must be True or False"),
    ("packing_probe", 1, "packing_probe must be True or False"),
])  # fmt: skip
def test_a_packing_option_is_refused_by_both_trainers_with_the_same_message(tmp_path, option, value, message):
    """The options both trainers take mean the same and are checked the same way, when the trainer is built."""
    from transformers import TrainingArguments

    from packing_collators import PackingTrainer

    model = tiny_model("llama", vocab_size=64, initializer_range=0.05)
    with pytest.raises(ValueError, match=message):
        PackingDPOTrainer(model=model, ref_model=copy.deepcopy(model), args=_config(tmp_path), train_dataset=_pairs(False),
                          processing_class=word_tokenizer(), **{option: value})  # fmt: skip
    args = TrainingArguments(output_dir=str(tmp_path / "sft"), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match=message):
        PackingTrainer(model=model, args=args, **{option: value})


def test_share_prompt_must_be_a_flag_and_the_options_are_keyword_only(tmp_path):
    import inspect

    model = tiny_model("llama", vocab_size=64, initializer_range=0.05)
    with pytest.raises(ValueError, match="share_prompt must be True or False, got 'no'"):
        _trainer(tmp_path, model=model, share_prompt="no")
    parameters = inspect.signature(PackingDPOTrainer.__init__).parameters
    for name in ("max_tokens_per_batch", "memory_check", "share_prompt", "packing_probe"):
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert f"{name}:" in PackingDPOTrainer.__doc__, name


def test_an_auto_budget_is_measured_on_the_gpu_and_refused_on_a_cpu_with_the_fix(tmp_path):
    trainer = _trainer(tmp_path, max_tokens_per_batch="auto", max_steps=1)
    assert trainer.max_tokens_per_batch == "auto"
    with pytest.raises(ValueError, match="max_tokens_per_batch='auto' measures the model's memory on its GPU.*Pass a number"):
        trainer.get_train_dataloader()
