"""The chunked loss on real model families: the model's own loss and gradients, without its logits.

Each tiny model (the architecture sweep's configs, float32, defaults left alone) gets one packed
batch; its own full-logit loss (``model(**batch).loss``) and gradients are the reference, and
``chunked_forward`` (plus the MoE aux loss) must give the same, for heads the model transforms
(Gemma 2's soft cap, Cohere's scale, Granite's divisor, Falcon-H1's multiplier), MoE models whose
loss adds the router's aux loss, hybrids and a vision-language model prepared by ``enable_packing``,
and gradient checkpointing. A head transform the chunked loss does not know is refused by the check.
"""

from __future__ import annotations

import pytest
import torch
from _hybrids import sweep

from packing_collators import FlatteningCollator, enable_packing
from packing_collators.batch import shifted_targets
from packing_collators.loss import add_aux_loss, check_output_head, chunked_forward, output_head

CAUSAL = {
    "llama": "LlamaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",  # final_logit_softcapping
    "cohere": "CohereForCausalLM",  # logit_scale
    "granite": "GraniteForCausalLM",  # logits_scaling
    "falcon_h1": "FalconH1ForCausalLM",  # lm_head_multiplier, and Mamba2 layers
    "mixtral": "MixtralForCausalLM",  # 8 experts, 2 per token, the router's aux loss
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",  # Gated DeltaNet
    "nemotron_h": "NemotronHForCausalLM",  # Mamba2 and MoE
}


def _model(model_type: str, class_name: str):
    import transformers

    if not hasattr(transformers, class_name):
        pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
    model = sweep.build_tiny(model_type, class_name, seed=0)
    config = model.config.get_text_config()
    if hasattr(config, "num_local_experts") or hasattr(config, "num_experts"):
        config.output_router_logits = True  # the aux loss joins the loss, as for training checkpoints
    return enable_packing(model).train()


def _batch(model):
    examples = sweep.random_examples(model.config, (9, 14, 5, 11), seed=1)
    return FlatteningCollator()(examples)


def _losses_and_grads(model, batch, chunked: bool):
    model.zero_grad()
    if chunked:
        head, why = output_head(model)
        assert head is not None, why
        targets = shifted_targets(batch)
        weights = torch.ones(targets.shape) / (targets != -100).sum()
        loss, outputs = chunked_forward(model, batch, head, targets, weights)
        loss = add_aux_loss(loss, outputs, head)
        assert outputs["logits"].shape[-1] == 0  # no logits were handed back
    else:
        loss = model(**batch).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_type", list(CAUSAL))
def test_the_chunked_loss_is_the_models_own_loss_and_gradients(model_type):
    model = _model(model_type, CAUSAL[model_type])
    head, _ = output_head(model)
    assert check_output_head(model, head) == ""  # the head the config describes is the head the model runs
    batch = _batch(model)
    torch.manual_seed(0)
    full, full_grads = _losses_and_grads(model, batch, chunked=False)
    torch.manual_seed(0)
    chunked, grads = _losses_and_grads(model, batch, chunked=True)
    assert chunked == pytest.approx(full, rel=1e-5)
    assert grads.keys() == full_grads.keys()
    for name, grad in full_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_gives_the_same_gradients(reentrant):
    model = _model("llama", CAUSAL["llama"])
    batch = _batch(model)
    full, full_grads = _losses_and_grads(model, batch, chunked=False)
    model.gradient_checkpointing_enable({"use_reentrant": reentrant})
    chunked, grads = _losses_and_grads(model, batch, chunked=True)
    assert chunked == pytest.approx(full, rel=1e-5)
    for name, grad in full_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_head_transform_the_config_does_not_describe_is_refused():
    model = _model("gemma2", CAUSAL["gemma2"])
    head, _ = output_head(model)
    assert head.transform.softcap  # read from final_logit_softcapping
    model.config.final_logit_softcapping = None  # the description now misses what the model does
    head, _ = output_head(model)
    model.config.final_logit_softcapping = 30.0
    assert check_output_head(model, head).startswith("its logits differ")


def test_a_moe_loss_without_its_aux_term_is_refused():
    model = _model("mixtral", CAUSAL["mixtral"])
    head, _ = output_head(model)
    assert head.aux_coef > 0
    from dataclasses import replace

    assert "router_aux_loss_coef" in check_output_head(model, replace(head, aux_coef=0.0))


def test_a_vision_language_model_with_images():
    from _vlms import available, mixed_examples, tiny_vlm

    if "qwen2_5_vl" not in available():
        pytest.skip("no Qwen2.5-VL in this transformers")
    model = enable_packing(tiny_vlm("qwen2_5_vl")).train()
    batch = FlatteningCollator()(mixed_examples(model.config))
    assert "pixel_values" in batch
    full, full_grads = _losses_and_grads(model, batch, chunked=False)
    chunked, grads = _losses_and_grads(model, batch, chunked=True)
    assert chunked == pytest.approx(full, rel=1e-5)
    for name, grad in full_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_head_check_accepts_a_bf16_model_whose_logits_round():
    # bf16 weights: the model's own logits round to bf16 (2^-8 relative), the check's projection does not
    model = _model("llama", CAUSAL["llama"]).to(torch.bfloat16)
    head, _ = output_head(model)
    assert check_output_head(model, head) == ""
    # some transformers versions hand back float32 logits computed in bf16 (seen on GPU with 5.17)
    model.lm_head.register_forward_hook(lambda module, args, out: out.float())
    assert check_output_head(model, head) == ""
    model.config.final_logit_softcapping = 1.0  # a transform the model never applies is still caught in bf16
    assert check_output_head(model, output_head(model)[0]).startswith("its logits differ")


def test_the_head_check_sees_the_autocast_the_forward_runs_under():
    # float32 weights under bf16 mixed precision (TRL's configs default to bf16=True): accelerate wraps the model's
    # forward in autocast, so the head's logits round to bf16 there while the check's own projection runs outside it
    model = _model("llama", CAUSAL["llama"])
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    head, _ = output_head(model)
    assert check_output_head(model, head) == ""
    model.config.final_logit_softcapping = 1.0  # a transform the model never applies is still caught under autocast
    assert check_output_head(model, output_head(model)[0]).startswith("its logits differ")
