"""fuse_rms_norms: a model's RMSNorms on torch's fused kernel where the norm computes rms_norm's numbers (checked on
each module), its own forward everywhere else; the model's outputs and gradients unchanged in float32."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from packing_collators import fuse_rms_norms
from packing_collators.fused._norms import _fused_forward


def _llama(**overrides) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, **overrides)  # fmt: skip
    model = LlamaForCausalLM(config)
    for module in model.modules():  # weights away from 1, so a norm that ignored them would show
        if type(module).__name__.endswith("RMSNorm"):
            torch.nn.init.normal_(module.weight, 1.0, 0.3)
    return model


def _run(model, ids):
    model.zero_grad()
    logits = model(input_ids=ids).logits
    logits.float().pow(2).mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


def test_a_llama_gets_every_norm_fused_and_the_same_outputs_and_gradients():
    model, ids = _llama(), torch.randint(0, 64, (2, 9))
    logits, grads = _run(model, ids)
    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert fuse_rms_norms(model) == len(norms) == 5
    assert all(m.forward.__func__ is _fused_forward for m in norms)
    fused_logits, fused_grads = _run(model, ids)
    torch.testing.assert_close(fused_logits, logits, rtol=1e-5, atol=1e-5)
    for got, want in zip(fused_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert fuse_rms_norms(model) == 5  # idempotent: nothing wrapped twice
    assert all(m.forward.__func__ is _fused_forward and m._packing_own_forward.__func__ is not _fused_forward for m in norms)


def test_a_norm_that_computes_something_else_keeps_its_forward():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    gemma = GemmaRMSNorm(16)  # x * (1 + weight): not rms_norm(x, weight)
    torch.nn.init.normal_(gemma.weight)

    class ShiftedRMSNorm(torch.nn.Module):  # the name and attributes of one, another formula
        def __init__(self):
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.ones(16)), 1e-6

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight + 0.1

    shifted = ShiftedRMSNorm()
    assert fuse_rms_norms(torch.nn.ModuleList([gemma, shifted])) == 0
    assert gemma.forward.__func__ is GemmaRMSNorm.forward and shifted.forward.__func__ is ShiftedRMSNorm.forward


def test_an_input_of_another_dtype_than_the_weight_takes_the_norms_own_forward():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(16)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 16)
    assert fuse_rms_norms(norm.to(torch.bfloat16)) == 1
    expected = LlamaRMSNorm.forward(norm, x)  # float32 states into a bf16 norm: the model's own promotion
    assert torch.equal(norm(x), expected) and norm(x).dtype == expected.dtype
    low = x.bfloat16()  # the weight's dtype: the fused kernel, within a bf16 rounding of the model's formula
    torch.testing.assert_close(norm(low).float(), LlamaRMSNorm.forward(norm, low).float(), rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize("tie", [True, False])
def test_the_model_trains_as_before_with_its_checkpoint_defaults(tie):
    # use_cache on and tied embeddings as checkpoints configure them: one optimizer step, the same weights after
    model, ids = _llama(tie_word_embeddings=tie), torch.randint(0, 64, (2, 9))
    reference = _llama(tie_word_embeddings=tie)
    fuse_rms_norms(model)
    for m in (model, reference):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        m(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
