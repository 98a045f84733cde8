"""fuse_swiglu: a model's gated MLPs run silu(gate) * up as one Triton kernel each way where the MLP computes it
(checked on each module), their own forward everywhere else. The kernels run here under Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET) on CPU tensors, as they run on CUDA ones: the model's outputs and
gradients are the unfused model's in float32, and in bf16 within the one rounding the kernel leaves out."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from packing_collators import fuse_swiglu
from packing_collators.fused import _mlp as _fused_mlp
from packing_collators.fused._mlp import _fused_forward, swiglu


@pytest.fixture
def kernels_here(monkeypatch):
    """The Triton kernels for CPU tensors (the interpreter), where the library runs them on CUDA only."""
    pytest.importorskip("triton")  # scripts/install.sh adds it (Linux x86-64); the oldest venv where CUDA torch brought it
    monkeypatch.setattr(_fused_mlp, "usable", lambda device, variant=None: True)


def _llama(**overrides) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, **overrides)  # fmt: skip
    return LlamaForCausalLM(config)  # tied embeddings off, the cache on: as LlamaConfig sets them


def _run(model, ids):
    model.zero_grad()
    logits = model(input_ids=ids).logits
    logits.float().pow(2).mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


def test_a_llama_gets_every_mlp_fused_on_the_kernel_and_the_same_outputs_and_gradients(kernels_here, monkeypatch):
    model, ids = _llama(), torch.randint(0, 64, (2, 9))
    logits, grads = _run(model, ids)
    mlps = [m for m in model.modules() if type(m).__name__ == "LlamaMLP"]
    assert fuse_swiglu(model) == len(mlps) == 2
    assert all(m.forward.__func__ is _fused_forward for m in mlps)
    launched = []
    apply = _fused_mlp._SwiGLU.apply
    monkeypatch.setattr(_fused_mlp._SwiGLU, "apply", lambda *a: launched.append(a[0].shape) or apply(*a))
    fused_logits, fused_grads = _run(model, ids)
    assert launched == [(2, 9, 72)] * 2  # the kernel ran in each layer, on the intermediate width
    torch.testing.assert_close(fused_logits, logits, rtol=1e-5, atol=1e-5)
    for got, want in zip(fused_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert fuse_swiglu(model) == 2  # idempotent: nothing wrapped twice
    assert all(m._packing_own_forward.__func__ is not _fused_forward for m in mlps)


@pytest.mark.parametrize("n", [1, 1024, 2 * 1024 + 5])  # one short block, one full, two and a short one
def test_the_kernels_compute_silu_times_up_and_its_gradients_in_float32_rounding_once(kernels_here, n):
    generator = torch.Generator().manual_seed(n)
    gate, up, grad = (torch.randn(n, generator=generator) * 6 for _ in range(3))
    gate[0] = -100.0  # exp(100) overflows float32's sigmoid denominator to inf: silu is 0, not nan
    g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
    out = swiglu(g, u)
    out.backward(grad)
    g64, u64 = gate.double().requires_grad_(), up.double().requires_grad_()
    reference = torch.nn.functional.silu(g64) * u64
    reference.backward(grad.double())
    torch.testing.assert_close(out.double(), reference.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.grad.double(), g64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(u.grad.double(), u64.grad, rtol=1e-5, atol=1e-6)
    # bf16, as a GPU trains: float32 inside and one conversion at the end, so within one bf16 step of float64 (on the
    # GPU the conversion rounds to nearest, half a step; Triton's interpreter truncates, a step at most)
    low = [t.to(torch.bfloat16).requires_grad_() for t in (gate, up)]
    low_grad = grad.to(torch.bfloat16)
    out = swiglu(*low)
    out.backward(low_grad)
    g64, u64 = (t.detach().double().requires_grad_() for t in low)
    exact = torch.nn.functional.silu(g64) * u64
    exact.backward(low_grad.double())
    assert out.dtype == low[0].grad.dtype == low[1].grad.dtype == torch.bfloat16
    for ours, want in ((out, exact), (low[0].grad, g64.grad), (low[1].grad, u64.grad)):
        assert ((ours.double() - want.detach()).abs() <= want.detach().abs() * 2**-7 + 1e-30).all()


def test_an_mlp_that_computes_something_else_keeps_its_forward():
    from transformers import GemmaConfig
    from transformers.models.gemma.modeling_gemma import GemmaMLP

    gelu = GemmaMLP(GemmaConfig(hidden_size=16, intermediate_size=32))  # gelu(gate) * up: not silu

    class ScaledMLP(torch.nn.Module):  # a SwiGLU MLP's parts, another formula
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = torch.nn.Linear(16, 32), torch.nn.Linear(16, 32)
            self.down_proj, self.act_fn = torch.nn.Linear(32, 16), torch.nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) * 2)

    class WithoutAct(torch.nn.Module):  # no act_fn: not recognised
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = (torch.nn.Linear(16, 16) for _ in range(3))

        def forward(self, x):
            return self.down_proj(self.gate_proj(x) * self.up_proj(x))

    for module in (gelu, ScaledMLP(), WithoutAct()):
        x = torch.randn(3, 16)
        before = module(x)
        assert fuse_swiglu(module) == 0
        assert "_packing_own_forward" not in vars(module)
        assert torch.equal(module(x), before)


def test_without_the_kernels_the_fused_forward_is_the_modules_own_numbers():
    # on the CPU (no kernel), or on a GPU where the kernel failed its check: torch's silu and product, bit for bit
    model, ids = _llama(), torch.randint(0, 64, (2, 9))
    logits, grads = _run(model, ids)
    assert fuse_swiglu(model) == 2
    fused_logits, fused_grads = _run(model, ids)
    assert torch.equal(fused_logits, logits)
    assert all(torch.equal(a, b) for a, b in zip(fused_grads, grads))


def test_the_kernels_are_checked_on_their_device_once_and_left_where_they_fail(monkeypatch):
    pytest.importorskip("triton")
    _fused_mlp._trusted.works_on.cache_clear()
    try:
        assert _fused_mlp._trusted.works_on("cpu")  # the interpreter's numbers are torch's
        monkeypatch.setattr(_fused_mlp._SwiGLU, "apply", lambda *a: (_ for _ in ()).throw(RuntimeError("no sm_99 target")))
        _fused_mlp._trusted.works_on.cache_clear()
        with pytest.warns(UserWarning, match="failed on cpu .*no sm_99 target.*torch's silu and product"):
            assert not _fused_mlp._trusted.works_on("cpu")
        monkeypatch.setattr(_fused_mlp._SwiGLU, "apply", lambda g, u: torch.nn.functional.silu(g) * u * 1.01)
        _fused_mlp._trusted.works_on.cache_clear()
        with pytest.warns(UserWarning, match="other numbers than torch"):
            assert not _fused_mlp._trusted.works_on("cpu")
    finally:
        _fused_mlp._trusted.works_on.cache_clear()


def test_a_compiled_fused_mlp_traces_torchs_ops_and_computes_the_same(kernels_here, monkeypatch):
    # compile_layers on a fused model: the graph gets silu and the product (Inductor fuses them), not the kernel
    model = _llama()
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 5, 32)
    expected = mlp(x)
    assert fuse_swiglu(mlp) == 1
    launched = []
    apply = _fused_mlp._SwiGLU.apply
    monkeypatch.setattr(_fused_mlp._SwiGLU, "apply", lambda *a: launched.append(1) or apply(*a))
    torch._dynamo.reset()
    compiled = torch.compile(mlp, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-6)
    assert launched == []
    torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-6)  # eager: the kernel
    assert launched == [1]
