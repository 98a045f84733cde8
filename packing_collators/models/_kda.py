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

A row laid out with its prompts shared runs each prompt once where the kernels take initial states
(``kda_shared_forward``, ``_shared_prefix.py``). Cost: the two kernels on ``T`` tokens, one launch each per
layer (the delta rule two for a shared-prompt row), no padding.
"""

from __future__ import annotations

import torch

from ._kernels import VarlenKernels, causal_conv, zero_padding

__all__ = ["kda_layout", "kda_shared_forward", "kda_varlen_forward"]

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

    def conv(mixed):
        return causal_conv(kernels, module.conv1d, mixed, module.activation, cu_seqlens)

    def kda(query, key, value, g, beta):
        return kernels.kda(query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens)[0]

    return _forward(module, zero_padding(hidden_states, mask), layout, conv, kda)


def kda_shared_forward(module, hidden_states: torch.Tensor, scope, kernels: VarlenKernels, layout: str):
    """The layer's output (1, T, H) for a row laid out with its prompts shared (``scope``: the call's kv_index,
    q_index and keys' segments), each prompt's tokens through the layer once: the conv over the keys' layout, the
    delta rule from each prompt's final state (``_shared_prefix.py``; fla's ``chunk_kda`` takes the states)."""
    from ._shared_prefix import on_keys, run_from_prompts

    def conv(mixed):
        conv1d = module.conv1d
        return on_keys(scope, lambda x, cu: causal_conv(kernels, conv1d, x, module.activation, cu), mixed, conv1d)

    def from_states(query, key, value, g, beta, cu_seqlens, initial_state=None, output_final_state=False):
        o, final = kernels.kda(query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens,
                               initial_state=initial_state, output_final_state=output_final_state)  # fmt: skip
        return (o, final) if output_final_state else o

    passes = scope.shared_prefix()
    return _forward(module, hidden_states, layout, conv, lambda *qkvgb: run_from_prompts(from_states, passes, *qkvgb))


def _forward(module, hidden_states: torch.Tensor, layout: str, conv, kda) -> torch.Tensor:
    """The layer's computation with its two sequence mixers given: ``conv(q | k | v)``, ``kda(q, k, v, g, beta)``."""
    length, shape = hidden_states.shape[1], (1, hidden_states.shape[1], -1, module.head_dim)
    projections = (module.q_proj(hidden_states), module.k_proj(hidden_states), module.v_proj(hidden_states))
    mixed = conv(torch.cat(projections, dim=-1))
    query, key, value = (x.reshape(shape) for x in mixed.split([p.shape[-1] for p in projections], dim=-1))
    g = module.forget_gate(hidden_states)
    beta = torch.sigmoid(module.b_proj(hidden_states))
    o = kda(query, key, value, g, beta)
    if layout == "g_ab":
        gate = module.g_b_proj(module.g_a_proj(hidden_states))
    else:
        gate = module.g_proj(hidden_states)
    o = module.o_norm(o, gate.reshape(shape)).reshape(1, length, -1)
    return module.o_proj(o)
