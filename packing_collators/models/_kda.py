"""Kimi Delta Attention (Kimi-Linear, Bailing-hybrid) on varlen kernels: the packed row in two launches, exact.

    hidden (1, T, H) -> q_proj | k_proj | v_proj -> causal_conv1d(cu_seqlens) + silu -> q, k, v (1, T, h, d)
                     -> forget_gate (the layer's own: g (1, T, h, d), a decay per channel), beta = sigmoid(b_proj)
                     -> chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens)
                     -> o_norm(o, output gate) -> o_proj

The same computation as transformers' ``KimiLinearDeltaAttention.forward`` (5.17 to 5.24) and
``BailingHybridDeltaAttention.forward`` (5.24), whose torch ``chunk_kimi_delta_attention`` is fla's
``chunk_kda`` written out (q and k l2-normalised, scale d^-0.5): given the boundaries, its state and the
conv window restart at every example. The decay comes from the layer's own ``forget_gate`` module, so
its formula is the installed version's. Output gates:

    g_ab   o_norm(o, g_b_proj(g_a_proj(hidden)))     Kimi-Linear (and GLM-5-Next's text layers, same code)
    g      o_norm(o, g_proj(hidden))                 Bailing-hybrid

Cost: the two kernels on ``T`` tokens, one launch each per layer, no padding.
"""

from __future__ import annotations

import torch

from ._kernels import VarlenKernels, causal_conv, zero_padding

__all__ = ["kda_layout", "kda_varlen_forward"]

_KDA = ("q_proj", "k_proj", "v_proj", "conv1d", "forget_gate", "b_proj", "o_norm", "o_proj", "num_heads", "head_dim")


def kda_layout(module) -> str | None:
    """``"g_ab"`` or ``"g"`` (the output gate) when ``module`` is a KDA layer this path computes, else None."""
    if not all(hasattr(module, name) for name in _KDA) or not hasattr(module, "activation"):
        return None
    if hasattr(module, "g_a_proj") and hasattr(module, "g_b_proj"):
        return "g_ab"
    return "g" if hasattr(module, "g_proj") else None


def kda_varlen_forward(
    module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, kernels: VarlenKernels, layout: str,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The layer's output (1, T, H) for a packed row whose examples end at ``cu_seqlens`` (``mask``: (1, T) or None)."""
    hidden_states = zero_padding(hidden_states, mask)
    length, shape = hidden_states.shape[1], (1, hidden_states.shape[1], -1, module.head_dim)
    projections = (module.q_proj(hidden_states), module.k_proj(hidden_states), module.v_proj(hidden_states))
    mixed = causal_conv(kernels, module.conv1d, torch.cat(projections, dim=-1), module.activation, cu_seqlens)
    query, key, value = (x.reshape(shape) for x in mixed.split([p.shape[-1] for p in projections], dim=-1))
    g = module.forget_gate(hidden_states)
    beta = torch.sigmoid(module.b_proj(hidden_states))
    o, _ = kernels.kda(query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens)
    if layout == "g_ab":
        gate = module.g_b_proj(module.g_a_proj(hidden_states))
    else:
        gate = module.g_proj(hidden_states)
    o = module.o_norm(o, gate.reshape(shape)).reshape(1, length, -1)
    return module.o_proj(o)
