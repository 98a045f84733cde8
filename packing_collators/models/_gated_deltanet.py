"""Gated DeltaNet layers on flash-linear-attention's varlen kernels: the packed row in one call, exact.

    hidden (1, T, H) -> in_proj -> causal_conv1d(cu_seqlens) -> q, k, v, a, b
                     -> chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens) -> gated RMSNorm(z) -> out_proj

The same computation as transformers' ``*GatedDeltaNet.forward`` (Qwen3.5, Qwen3.5-MoE, Qwen3-Next),
with the boundaries given to both kernels, so the conv window and the delta rule's state restart
at every example. Two projection layouts exist:

    split   in_proj_qkv, in_proj_z, in_proj_b, in_proj_a     Qwen3.5, Qwen3.5-MoE
    fused   in_proj_qkvz, in_proj_ba (head-interleaved)      Qwen3-Next

The kernels are passed in (``VarlenKernels``, ``_kernels.py``): flash-linear-attention's Triton ones on a
GPU, or any with the same signatures (the tests give a per-example torch reference, so the wiring is
checked on a CPU). A row laid out with its prompts shared (``batch.SharedPromptLayout``) runs each prompt once
where the delta rule takes initial states (``gated_deltanet_shared_forward``, ``_shared_prefix.py``). Cost: the
kernels' own, on ``T`` tokens: no padding, one launch per layer (two for a shared-prompt row).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._kernels import VarlenKernels

__all__ = [
    "GatedDeltaNetKernels",
    "gated_deltanet_layout",
    "gated_deltanet_shared_forward",
    "gated_deltanet_varlen_forward",
]

_SPLIT = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
_FUSED = ("in_proj_qkvz", "in_proj_ba")
_COMMON = ("conv1d", "A_log", "dt_bias", "norm", "out_proj", "head_k_dim", "head_v_dim", "num_k_heads", "num_v_heads")
GatedDeltaNetKernels = VarlenKernels  # (conv, delta_rule, name, device_type): all the Gated DeltaNet path needs


def gated_deltanet_layout(module) -> str | None:
    """``"split"`` or ``"fused"`` when ``module`` is a Gated DeltaNet layer this path computes, else None."""
    if not all(hasattr(module, name) for name in _COMMON):
        return None
    if all(hasattr(module, name) for name in _SPLIT):
        return "split"
    if all(hasattr(module, name) for name in _FUSED) and hasattr(module, "fix_query_key_value_ordering"):
        return "fused"
    return None


def _projections(module, hidden_states: torch.Tensor, layout: str):
    """(mixed_qkv (1, T, 2K + V), z (1, T, HV, V), b (1, T, HV), a (1, T, HV)) as the layer computes them."""
    if layout == "split":
        mixed_qkv = module.in_proj_qkv(hidden_states)
        z = module.in_proj_z(hidden_states).reshape(*hidden_states.shape[:2], -1, module.head_v_dim)
        return mixed_qkv, z, module.in_proj_b(hidden_states), module.in_proj_a(hidden_states)
    qkvz, ba = module.in_proj_qkvz(hidden_states), module.in_proj_ba(hidden_states)
    query, key, value, z, b, a = module.fix_query_key_value_ordering(qkvz, ba)
    batch, length = hidden_states.shape[:2]
    flat = [x.reshape(batch, length, -1) for x in (query, key, value)]
    return torch.cat(flat, dim=-1), z, b.reshape(batch, length, -1), a.reshape(batch, length, -1)


def _conv(module, kernels: VarlenKernels):
    """The layer's depthwise conv (then its activation) over a row: ``(x, cu_seqlens) -> y``."""
    weight = module.conv1d.weight.squeeze(1)
    return lambda x, cu_seqlens: kernels.conv(x, weight, module.conv1d.bias, module.activation, cu_seqlens)


def gated_deltanet_varlen_forward(
    module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, kernels: VarlenKernels, layout: str
) -> torch.Tensor:
    """The layer's output (1, T, H) for a packed row whose examples end at ``cu_seqlens``."""
    conv = _conv(module, kernels)
    return _forward(module, hidden_states, layout, lambda x: conv(x, cu_seqlens),
                    lambda *qkvgb: kernels.delta_rule(*qkvgb, cu_seqlens))  # fmt: skip


def gated_deltanet_shared_forward(module, hidden_states: torch.Tensor, scope, kernels: VarlenKernels, layout: str):
    """The layer's output (1, T, H) for a row laid out with its prompts shared (``scope``: the call's kv_index,
    q_index and keys' segments), each prompt's tokens through the layer once: the conv over the keys' layout (a
    window of the prompt before each completion), the delta rule from each prompt's final state
    (``_shared_prefix.py``). ``kernels.delta_rule`` takes ``initial_state`` and ``output_final_state``."""
    from ._shared_prefix import on_keys, run_from_prompts

    conv, passes = _conv(module, kernels), scope.shared_prefix()
    return _forward(module, hidden_states, layout, lambda x: on_keys(scope, conv, x, module.conv1d),
                    lambda *qkvgb: run_from_prompts(kernels.delta_rule, passes, *qkvgb))  # fmt: skip


def _forward(module, hidden_states: torch.Tensor, layout: str, conv, delta_rule) -> torch.Tensor:
    """The layer's computation with its two sequence mixers given: ``conv(mixed_qkv)``, ``delta_rule(q, k, v, g,
    beta)``."""
    batch, length, _ = hidden_states.shape
    mixed_qkv, z, b, a = _projections(module, hidden_states, layout)
    mixed_qkv = conv(mixed_qkv)
    key_dim = module.head_k_dim * module.num_k_heads
    query, key, value = torch.split(mixed_qkv, [key_dim, key_dim, module.head_v_dim * module.num_v_heads], dim=-1)
    query = query.reshape(batch, length, -1, module.head_k_dim)
    key = key.reshape(batch, length, -1, module.head_k_dim)
    value = value.reshape(batch, length, -1, module.head_v_dim)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)
    out = delta_rule(query, key, value, g, beta)
    out = module.norm(out.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))
    return module.out_proj(out.reshape(batch, length, -1))
