"""fuse_rope: the rotary embedding of queries and keys as one Triton kernel each way, where the model's family computes
the standard one (measured on its function), the family's own function everywhere else. The kernel runs here under
Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET) on CPU tensors, as it runs on CUDA ones: a model's
outputs and gradients are the unfused model's in float32, and in bf16 within the one rounding the kernel leaves out."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

from packing_collators import fuse_rope
from packing_collators.fused import _rope
from packing_collators.fused._rope import _reference, rotate, unfuse_rope


@pytest.fixture
def kernels_here(monkeypatch):
    """The Triton kernel for CPU tensors (the interpreter), where the library runs it on CUDA only."""
    pytest.importorskip("triton")  # scripts/install.sh adds it (Linux x86-64); the oldest venv where CUDA torch brought it
    monkeypatch.setattr(_rope, "usable", lambda device, variant=None: True)


@pytest.fixture(autouse=True)
def families_restored():
    """fuse_rope changes a family's module for the whole process: every test leaves them as transformers has them."""
    own = modeling_llama.apply_rotary_pos_emb, modeling_qwen3.apply_rotary_pos_emb
    yield
    unfuse_rope()
    assert (modeling_llama.apply_rotary_pos_emb, modeling_qwen3.apply_rotary_pos_emb) == own


def _run(model, ids, position_ids=None):
    model.zero_grad()
    logits = model(input_ids=ids, position_ids=position_ids).logits
    logits.float().pow(2).mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_model_gets_every_layers_rotary_embedding_on_the_kernel_and_the_same_outputs_and_gradients(
    kernels_here, monkeypatch, family
):
    torch.manual_seed(0)
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64, head_dim=8)  # fmt: skip (Qwen3Config's own head_dim is 128)
    model = LlamaForCausalLM(LlamaConfig(**common)) if family == "llama" else Qwen3ForCausalLM(Qwen3Config(**common))
    ids = torch.randint(0, 64, (2, 9))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]] * 2)  # packed rows: positions restart per example
    logits, grads = _run(model, ids, positions)
    assert fuse_rope(model) == 3  # one attention layer each
    launched = []
    apply = _rope._Rotate.apply
    monkeypatch.setattr(_rope._Rotate, "apply", lambda *a: launched.append(tuple(a[0].shape)) or apply(*a))
    fused_logits, fused_grads = _run(model, ids, positions)
    assert launched == [(2, 4, 9, 8), (2, 2, 9, 8)] * 3  # queries and keys, in each layer
    torch.testing.assert_close(fused_logits, logits, rtol=1e-5, atol=1e-5)
    for got, want in zip(fused_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert fuse_rope(model) == 3  # idempotent: the function wrapped once
    family_module = modeling_llama if family == "llama" else modeling_qwen3
    assert not hasattr(family_module.apply_rotary_pos_emb._packing_own, "_packing_own")


@pytest.mark.parametrize("width", [8, 64, 80])  # 80: a half of 40, not a power of two (the kernel masks it)
def test_the_kernel_rotates_in_float32_rounding_once_and_its_gradient_is_the_inverse_rotation(kernels_here, width):
    generator = torch.Generator().manual_seed(width)
    # (batch, tokens, heads, dim) transposed, as the layers' q_proj views reach it; 2 x 3 x 7 = 42 rows: a short program
    x = torch.randn(2, 7, 3, width, generator=generator).transpose(1, 2)
    angles = torch.rand(1, 7, width // 2, generator=generator) * 100
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    grad = torch.randn(2, 3, 7, width, generator=generator)
    leaf = x.detach().requires_grad_()
    out = rotate(leaf, cos, sin)
    out.backward(grad)
    x64 = x.double().requires_grad_()
    want = _reference(x64, cos.double(), sin.double())
    want.backward(grad.double())
    assert out.stride() == x.stride()  # the input's layout, as torch's ops keep it
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(leaf.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    # bf16, as a GPU trains (transformers casts cos and sin to the dtype): float32 inside and one conversion, so
    # within one bf16 step of float64 (the GPU rounds to nearest, half a step; Triton's interpreter truncates)
    low, low_cos, low_sin = (t.to(torch.bfloat16) for t in (x, cos, sin))
    leaf = low.detach().requires_grad_()
    out = rotate(leaf, low_cos, low_sin)
    out.backward(grad.to(torch.bfloat16))
    x64 = low.double().requires_grad_()
    exact = _reference(x64, low_cos.double(), low_sin.double())
    exact.backward(grad.to(torch.bfloat16).double())
    for ours, reference in ((out, exact), (leaf.grad, x64.grad)):
        assert ours.dtype == torch.bfloat16
        step = torch.finfo(torch.bfloat16).eps * reference.detach().abs().clamp_min(1e-3)
        assert ((ours.double() - reference.detach()).abs() <= step + 1e-30).all()


def test_a_batch_of_angles_per_row_and_the_calls_the_kernel_does_not_take_run_the_familys_own(kernels_here):
    fused = _rope._fused(modeling_llama.apply_rotary_pos_emb)
    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 5, 8, generator=generator), torch.randn(2, 2, 5, 8, generator=generator)
    cos, sin = torch.randn(2, 5, 8, generator=generator), torch.randn(2, 5, 8, generator=generator)
    for got, x in zip(fused(q, k, cos, sin), (q, k)):  # angles per batch row (cos of shape (batch, tokens, dim))
        torch.testing.assert_close(got, _reference(x, cos, sin), rtol=1e-6, atol=1e-6)
    calls = []
    kernel = _rope._Rotate.apply
    _rope._Rotate.apply = lambda *a: calls.append(1) or kernel(*a)
    try:  # the default unsqueeze_dim spelled out, by position or by name: the kernel's layout, taken
        fused(q, k, cos, sin, 1), fused(q, k, cos, sin, unsqueeze_dim=1)
    finally:
        _rope._Rotate.apply = kernel
    assert len(calls) == 4
    calls = []
    kernel = _rope._Rotate.apply
    _rope._Rotate.apply = lambda *a: calls.append(1) or kernel(*a)
    try:
        own = modeling_llama.apply_rotary_pos_emb
        half_q = q.transpose(1, 2)  # (batch, tokens, heads, dim) with unsqueeze_dim=2: the family's own function
        for args, kwargs in (
            ((half_q, k.transpose(1, 2), cos, sin), {"unsqueeze_dim": 2}),
            ((q, k, cos.double(), sin.double()), {}),  # mixed dtypes: torch's promotion, the family's own
            ((q, k, cos.requires_grad_(), sin), {}),  # angles with a gradient: the kernel gives none
        ):
            torch.testing.assert_close(fused(*args, **kwargs), own(*args, **kwargs))
        assert calls == []
    finally:
        _rope._Rotate.apply = kernel


def test_variants_of_the_rotary_embedding_keep_their_own_function():
    def interleaved(q, k, cos, sin, unsqueeze_dim=1):  # GPT-J's pairs (0, 1), (2, 3), ...: not rotate_half
        def rotate_pairs(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + rotate_pairs(q) * sin, k * cos + rotate_pairs(k) * sin

    def first_half_angles(q, k, cos, sin, unsqueeze_dim=1):  # assumes cos's halves equal: wrong on the probe's angles
        half = q.shape[-1] // 2
        cos = torch.cat([cos[..., :half]] * 2, -1)
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)

    def multimodal(q, k, cos, sin, mrope_section, unsqueeze_dim=1):  # Qwen2-VL's signature: the probe cannot call it
        return q, k

    assert _rope._computes_rope(modeling_llama.apply_rotary_pos_emb)
    assert not any(_rope._computes_rope(f) for f in (interleaved, first_half_angles, multimodal))


def test_off_cuda_without_the_kernel_the_fused_model_runs_the_familys_own_function():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=32))  # fmt: skip
    ids = torch.randint(0, 32, (1, 6))
    expected = model(input_ids=ids).logits
    assert fuse_rope(model) == 2
    assert modeling_llama.apply_rotary_pos_emb is not modeling_llama.apply_rotary_pos_emb._packing_own
    assert torch.equal(model(input_ids=ids).logits, expected)
    assert unfuse_rope() == 1
    assert not hasattr(modeling_llama.apply_rotary_pos_emb, "_packing_own")


def test_the_kernel_is_checked_on_its_device_once_and_left_where_it_differs(monkeypatch):
    pytest.importorskip("triton")
    _rope._trusted.works_on.cache_clear()
    try:
        assert _rope._trusted.works_on("cpu")  # the interpreter's numbers are torch's, transposed queries included
        _rope._trusted.works_on.cache_clear()
        monkeypatch.setattr(_rope, "_launch", lambda x, cos, sin, inverse: x * 1.0)  # a kernel that does not rotate
        with pytest.warns(UserWarning, match="other numbers than torch.*the rotary embedding runs torch's ops"):
            assert not _rope._trusted.works_on("cpu")
    finally:
        _rope._trusted.works_on.cache_clear()


def test_a_compiled_fused_function_traces_the_familys_own_ops_in_one_graph(kernels_here, monkeypatch):
    # compile_layers (or torch_compile) on a fused model: the layers' graphs get transformers' ops (Inductor fuses
    # them), not the kernel, and no graph break; the layer looks the function up in its module, as here
    torch.manual_seed(0)
    assert fuse_rope(LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=32))) == 1
    q, k, cos, sin = torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    expected = modeling_llama.apply_rotary_pos_emb._packing_own(q, k, cos, sin)
    monkeypatch.setattr(_rope._Rotate, "apply", lambda *a: pytest.fail("the kernel ran inside torch.compile"))

    def rotary(q, k, cos, sin):
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)

    torch._dynamo.reset()
    got = torch.compile(rotary, backend="aot_eager", fullgraph=True)(q, k, cos, sin)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
