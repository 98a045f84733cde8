"""fuse_rms_norms(model): a model's RMSNorms on torch's fused kernel, where it computes what the model's own does.

transformers' Llama-family ``*RMSNorm`` runs its formula op by op in eager mode (a float32 copy, its square, a mean,
rsqrt, two products, a cast back: about six passes over (tokens, hidden) forward and more backward, twice per layer).
``torch.nn.functional.rms_norm`` is one fused CUDA kernel each way (torch >= 2.8; the norm torchtitan's Llama runs):
on an eager 8B model it was the whole gap to torchtitan's step rate (docs/benchmarks.md, the 8B rows). Under
``torch.compile`` Inductor fuses either, so this is for eager training.

Which norms: each module whose class name ends in ``RMSNorm``, with a ``weight`` of its width and ``variance_epsilon``
or ``eps``, whose own forward gives ``rms_norm``'s numbers on a random float32 input (1e-5): measured on the module,
not guessed from its name, so Gemma's ``(1 + weight)``, zero-centred or gated norms keep their own forward.
Numerics: the same formula in float32; under bf16 the fused kernel rounds once, after the weight's product, where
transformers rounds the normalised tensor first (one rounding fewer). Inputs of another dtype than the weight (a
float32 residual into a bf16 norm) take the module's own forward.

>>> from transformers.models.llama.modeling_llama import LlamaRMSNorm
>>> norm = LlamaRMSNorm(8, eps=1e-5)
>>> _ = torch.nn.init.normal_(norm.weight)
>>> x = torch.randn(3, 8)
>>> expected = norm(x)
>>> fuse_rms_norms(norm)
1
>>> torch.allclose(norm(x), expected, atol=1e-6)
True
"""

from __future__ import annotations


import torch

from ._swap import swap_forwards

__all__ = ["fuse_rms_norms"]


def fuse_rms_norms(model: torch.nn.Module) -> int:
    """Make every RMSNorm of ``model`` that computes ``rms_norm``'s numbers call torch's fused kernel; returns how
    many. Idempotent; the weight is read at each call (FSDP2 and PEFT may swap it)."""
    return swap_forwards(model, _computes_rms_norm, _fused_forward)


def _eps(module) -> float | None:
    value = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return float(value) if isinstance(value, (int, float)) else None


def _computes_rms_norm(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an RMSNorm whose forward is ``rms_norm(x, weight, eps)``, run once to see."""
    weight = getattr(module, "weight", None)
    if not type(module).__name__.endswith("RMSNorm") or not isinstance(weight, torch.nn.Parameter) or weight.ndim != 1:
        return False
    if _eps(module) is None or weight.device.type == "meta":
        return False
    x = torch.randn(4, weight.shape[0], generator=torch.Generator().manual_seed(0)).to(weight.device)
    try:
        with torch.no_grad():
            own = module(x)
            fused = torch.nn.functional.rms_norm(x, (weight.shape[0],), weight.float(), _eps(module))
    except Exception:  # noqa: BLE001 - a norm that cannot run on this probe keeps its forward
        return False
    return isinstance(own, torch.Tensor) and own.shape == x.shape and torch.allclose(own.float(), fused, atol=1e-5)


def _fused_forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if args or kwargs or hidden_states.dtype != self.weight.dtype:
        return self._packing_own_forward(hidden_states, *args, **kwargs)
    width = (hidden_states.shape[-1],)
    return torch.nn.functional.rms_norm(hidden_states, width, self.weight, _eps(self))
