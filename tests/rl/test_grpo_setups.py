"""Set-ups TRL users run, each against TRL's GRPOTrainer on the same checkpoint and seed (tests/rl/_grpo.py): what a
review found accepted and different, or refused although it packs exactly.

The checkpoints keep their configs' defaults (``use_cache`` on, tied embeddings where the type ties them, GPT-2's
dropout); the sharper ones (initializer range 0.2-0.5) make near-ties and float32 rounding visible where a
near-uniform model would hide them.
"""

from __future__ import annotations

import logging

import pytest
from _grpo import _compare, _run

trl = pytest.importorskip("trl")
if tuple(int(x) for x in trl.__version__.split(".")[:2]) < (1, 16):
    pytest.skip("PackingGRPOTrainer builds on TRL >= 1.16's GRPOTrainer", allow_module_level=True)

SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, pad_token_id=0, head_dim=8)  # fmt: skip
GPT2 = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, pad_token_id=0)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("rl_setups")
    built = {
        "llama": ("llama", {**SMALL, "initializer_range": 0.2}),
        "phi3": ("phi3", {**SMALL, "initializer_range": 0.5}),
        # learned positions, 128 of them; no dropout, so the run can equal TRL's
        "gpt2_128": ("gpt2", {**GPT2, "initializer_range": 0.2, "n_positions": 128, "attn_pdrop": 0.0,
                              "resid_pdrop": 0.0, "embd_pdrop": 0.0}),  # fmt: skip
        "gpt2_dropout": ("gpt2", {**GPT2, "initializer_range": 0.2}),  # its checkpoints' dropout 0.1
        # no decoder layers: the hidden states are the embedding's, normed, the same on both sides under autocast,
        # so what differs is the head alone
        "head_only": ("llama", {**SMALL, "num_hidden_layers": 0, "initializer_range": 0.2}),
        "head_only_tied": ("llama", {**SMALL, "num_hidden_layers": 0, "initializer_range": 0.2,
                                     "tie_word_embeddings": True}),  # fmt: skip
    }
    paths = {}
    for name, (model_type, options) in built.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **options), dtype=torch.float32)
        paths[name] = folder / name
        model.save_pretrained(paths[name])
    from _vlms import as_loaded

    for model_type in ("qwen2_vl", "qwen3_vl"):  # vision-language checkpoints trained on text prompts
        paths[model_type] = folder / model_type
        as_loaded(model_type).save_pretrained(paths[model_type])
    return paths


@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("options", [
    {"entropy_coef": 0.05},  # TRL's entropy bonus: the loss rewards each token's entropy, so it has a gradient
    {"entropy_coef": 0.05, "top_entropy_quantile": 0.5},
    {"use_adaptive_entropy": True, "entropy_coef": 0.05, "entropy_target": 10.0},
])  # fmt: skip
def test_the_entropy_bonus_trains_as_trl(tmp_path, checkpoints, options, share_prompt):
    _compare(tmp_path, checkpoints["llama"], share_prompt, **options)


def test_the_entropy_bonus_through_a_peft_copy_of_the_head_trains_as_trl(tmp_path, checkpoints):
    """``modules_to_save=["lm_head"]``: the log-probabilities and entropies from the full logits, the bonus's too."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"], lora_dropout=0.0)
    _compare(tmp_path, checkpoints["llama"], True, both={"peft_config": config}, entropy_coef=0.05)


@pytest.mark.parametrize(("share_prompt", "options"), [
    (False, {"top_entropy_quantile": 0.5, "max_completion_length": 10}),
    (True, {"top_entropy_quantile": 0.3, "mask_truncated_completions": True, "max_completion_length": 10}),
])  # fmt: skip
def test_the_high_entropy_mask_keeps_trls_ties(tmp_path, checkpoints, share_prompt, options):
    """TRL's padded forward computes a group's first completion token (the same context in every row) as the same
    entropy, bit for bit, and its quantile threshold falls on such ties; the packed row computes them a last bit
    apart. Measured before the tie: step-2 loss -0.21867 against TRL's -0.26866 (unshared), 0 against 0.17496."""
    _compare(tmp_path, checkpoints["llama"], share_prompt, **options)


def test_a_sharp_model_is_not_refused_for_float32_rounding(tmp_path, checkpoints):
    """Log-probabilities of -15 to -25 round to ~1e-5 in float32: the shared layout's check bounds the difference
    relative to them (it refused at 1.24e-5 against an absolute 1e-5, a run that equals TRL within 1e-6)."""
    _compare(tmp_path, checkpoints["phi3"], True, temperature=0.7, max_completion_length=12)


@pytest.mark.parametrize("share_prompt", [False, True])
def test_a_model_of_short_context_is_checked_within_it(tmp_path, checkpoints, share_prompt):
    """GPT-2 with 128 learned positions: the shared check's longest group (a 512-token prompt where TRL sets no limit,
    and the completion) is cut to the context, where it raised an IndexError before training."""
    _compare(tmp_path, checkpoints["gpt2_128"], share_prompt, max_completion_length=12)


@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("checkpoint, weights", [("head_only", "float32"), ("head_only_tied", "float32"),
                                                 ("head_only_tied", "bfloat16")])  # fmt: skip
def test_a_head_cast_to_float32_projects_as_trls(tmp_path, checkpoints, checkpoint, weights, share_prompt):
    """cast_lm_head_to_fp32 (the ScaleRL recipe) under TRL's default bf16: TRL casts the head's weight to float32 and
    projects the hidden states in float32 outside autocast; the packed head does the same. With no decoder layers
    the body rounds nothing differently, so the metrics measure the head: equal within 1e-4 (a head projecting
    under autocast instead was 0.39 off relative in the KL and 5e-4 in grad_norm). Float32 weights, untied and tied,
    and bf16 weights tied (TRL casts the embedding's output back to bf16): there the embedding's bf16 gradient sums a
    shared prompt's token once, where TRL's sums its copies, measured 1.4e-4 apart in grad_norm (bf16's step 3.9e-3)."""
    bound = 1e-3 if weights == "bfloat16" and share_prompt else 1e-4
    _compare(tmp_path, checkpoints[checkpoint], share_prompt, bf16=True, cast_lm_head_to_fp32=True,
             model_init_kwargs={"dtype": weights}, grad_norm_rel=bound)  # fmt: skip


@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen3_vl"])
def test_a_vision_language_model_on_text_prompts_trains_as_trl(tmp_path, checkpoints, model_type, share_prompt):
    """Qwen2-VL and Qwen3-VL number text on three rotary axes: on text prompts each axis is the row's text position,
    a shared prompt's completions numbered on from it (the shared layout crashed in the rotary before the first
    step); a sampled image placeholder is text, as TRL's forward reads it (it was refused mid-run)."""
    _compare(tmp_path, checkpoints[model_type], share_prompt)


def test_a_head_cast_to_float32_that_only_the_full_logits_can_score_is_refused_before_training(tmp_path, checkpoints):
    """A PEFT copy of the head (modules_to_save) is scored through the model's own logits, which the packed path
    cannot project in float32 outside autocast as TRL's cast_lm_head_to_fp32 does: refused when training begins
    (it ran under autocast, 6e-3 from TRL's float32 head)."""
    peft = pytest.importorskip("peft")
    from packing_collators import PackingGRPOTrainer

    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"], lora_dropout=0.0)
    with pytest.raises(ValueError, match=r"cast_lm_head_to_fp32=True, and .* model's own logits .*modules_to_save"):
        _run(tmp_path, checkpoints["llama"], PackingGRPOTrainer, trainer_options={"peft_config": config},
             cast_lm_head_to_fp32=True, max_steps=1)  # fmt: skip


def _liger_stand_in(monkeypatch, norm):
    """Liger Kernel as transformers applies it at train() (Triton does not run here): ``liger_kernel`` importable, and
    its ``_apply_liger_kernel_to_instance`` putting ``norm`` (hidden, weight, eps) in every RMSNorm's forward; the
    configs it was applied with, returned."""
    import sys
    from types import ModuleType

    import transformers.integrations.liger as integration

    applied: list = []

    def apply(model, **config):
        applied.append(config)
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.forward = lambda hidden, module=module: norm(hidden, module.weight, module.variance_epsilon)

    package, submodule = ModuleType("liger_kernel"), ModuleType("liger_kernel.transformers")
    submodule._apply_liger_kernel_to_instance = apply
    package.transformers = submodule
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", submodule)
    monkeypatch.setattr(integration, "is_liger_kernel_available", lambda: True)
    return applied


def _rms_norm(hidden, weight, eps):  # each token on its own, as Liger's RMSNorm kernel
    import torch

    variance = hidden.float().pow(2).mean(-1, keepdim=True)
    return weight * (hidden.float() * torch.rsqrt(variance + eps)).to(hidden.dtype)


@pytest.mark.parametrize("share_prompt", [False, True])
def test_liger_layer_kernels_are_probed_in_place_and_train_as_trl(tmp_path, checkpoints, monkeypatch, share_prompt):
    """use_liger_kernel=True: TRL 1.16 keeps Liger's layer kernels (its fused loss is turned off, the head is TRL's),
    which the Trainer puts in at train(), before the probe. Per-token kernels train as TRL's with them; a kernel that
    mixes a row's tokens is refused by the probe before the first step."""
    from packing_collators import PackingGRPOTrainer

    applied = _liger_stand_in(monkeypatch, _rms_norm)
    _compare(tmp_path, checkpoints["llama"], share_prompt, use_liger_kernel=True)
    assert applied and all(config.get("fused_linear_cross_entropy") is False for config in applied)

    def row_norm(hidden, weight, eps):  # normalized over the whole row: packed sequences see each other
        return weight * hidden * torch.rsqrt(hidden.pow(2).mean((-2, -1), keepdim=True) + eps)

    import torch

    _liger_stand_in(monkeypatch, row_norm)
    with pytest.raises(ValueError, match="packing probe FAILED.*input_layernorm"):
        _run(tmp_path / "mixing", checkpoints["llama"], PackingGRPOTrainer,
             trainer_options={"share_prompt": share_prompt}, use_liger_kernel=True)  # fmt: skip


def test_dropout_left_on_trains_and_says_it_draws_its_own_masks(tmp_path, checkpoints, caplog):
    """GPT-2's checkpoints drop 10% and TRL's disable_dropout is False: the packed and padded forwards draw different
    masks (equal in distribution, not number for number), which the run says before its first step."""
    from packing_collators import PackingGRPOTrainer

    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        logs, shapes, _ = _run(tmp_path, checkpoints["gpt2_dropout"], PackingGRPOTrainer, max_steps=1)
    assert "dropout is on while training (attn_pdrop=0.1" in caplog.text and "disable_dropout=True" in caplog.text
    assert len(logs) == 1 and shapes and all(shape[0] == 1 for shape in shapes)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        _run(tmp_path / "off", checkpoints["gpt2_128"], PackingGRPOTrainer, max_steps=1)
    assert "dropout is on" not in caplog.text
