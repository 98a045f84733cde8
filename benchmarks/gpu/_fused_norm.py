"""The model's RMSNorm as torch's fused kernel: the norm torchtitan's Llama runs, for an eager comparison (#46).

torchtitan's Llama normalises with ``torch.nn.RMSNorm``, whose ``rms_norm`` runs one fused CUDA kernel each way
(``_fused_rms_norm``, torch >= 2.8). transformers' ``LlamaRMSNorm`` runs its formula op by op in eager mode (a float32
copy, its square, a mean, rsqrt, two products, a cast back): about six passes over a (tokens, 4096) tensor in the
forward, more in the backward, 65 norms per 8B forward, twice under full activation checkpointing. Compiled, inductor
fuses them on either side; eager, this is a difference of model code, not of packing. ``--rms-norm torch`` in
scale_8b.py gives both sides the same kernel.

Numerics: the same formula in float32; transformers rounds the normalised tensor to the weight's dtype before the
product with the weight, the fused kernel after it (one rounding fewer under bf16). Equal in float32 up to rounding:

>>> import torch
>>> from transformers.models.llama.modeling_llama import LlamaRMSNorm
>>> norm = LlamaRMSNorm(8, eps=1e-5)
>>> _ = torch.nn.init.normal_(norm.weight)
>>> x = torch.randn(3, 8, requires_grad=True)
>>> expected = norm(x)
>>> torch_rms_norm(norm)
1
>>> torch.allclose(norm(x), expected, atol=1e-6)
True
"""

from __future__ import annotations

import types

import torch

__all__ = ["torch_rms_norm"]


def _forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.variance_epsilon)


def torch_rms_norm(model: torch.nn.Module) -> int:
    """Make every ``*RMSNorm`` of ``model`` with a weight and ``variance_epsilon`` (transformers' Llama family) call
    ``torch.nn.functional.rms_norm``; the number of norms changed. Reads the weight at each call (FSDP2 swaps it)."""
    count = 0
    for module in model.modules():
        norm = type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")
        if norm and module.weight is not None:
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count
