"""Gated DeltaNet layers on flash-linear-attention's varlen kernels: the packed row in one call, exact.

    hidden (1, T, H) -> in_proj -> causal_conv1d(cu_seqlens) -> q, k, v, a, b
                     -> chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens) -> gated RMSNorm(z) -> out_proj

The same computation as transformers' ``*GatedDeltaNet.forward`` (Qwen3.5, Qwen3.5-MoE, Qwen3-Next),
with the boundaries given to both kernels, so the conv window and the delta rule's state restart
at every example. Two projection layouts exist:

    split   in_proj_qkv, in_proj_z, in_proj_b, in_proj_a     Qwen3.5, Qwen3.5-MoE
    fused   in_proj_qkvz, in_proj_ba (head-interleaved)      Qwen3-Next

The kernels are passed in (``GatedDeltaNetKernels``): flash-linear-attention's Triton ones on a GPU,
or any pair with the same signatures (the tests give a per-example torch reference, so the wiring is
checked on a CPU). Cost: the kernels' own, on ``T`` tokens: no padding, one launch per layer.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["GatedDeltaNetKernels", "fla_kernels", "gated_deltanet_layout", "gated_deltanet_varlen_forward"]

_SPLIT = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
_FUSED = ("in_proj_qkvz", "in_proj_ba")
_COMMON = ("conv1d", "A_log", "dt_bias", "norm", "out_proj", "head_k_dim", "head_v_dim", "num_k_heads", "num_v_heads")
FLA_CHECKED = "0.6.0"  # the flash-linear-attention version the varlen path was measured with


@dataclass(frozen=True)
class GatedDeltaNetKernels:
    """``conv(x (1, T, D), weight (D, W), bias, activation, cu_seqlens) -> (1, T, D)`` and
    ``delta_rule(q, k, v, g, beta, cu_seqlens) -> o (1, T, HV, V)`` (q, k l2-normalised inside),
    used for hidden states on ``device_type``."""

    conv: Callable
    delta_rule: Callable
    name: str
    device_type: str = "cuda"


def gated_deltanet_layout(module) -> str | None:
    """``"split"`` or ``"fused"`` when ``module`` is a Gated DeltaNet layer this path computes, else None."""
    if not all(hasattr(module, name) for name in _COMMON):
        return None
    if all(hasattr(module, name) for name in _SPLIT):
        return "split"
    if all(hasattr(module, name) for name in _FUSED) and hasattr(module, "fix_query_key_value_ordering"):
        return "fused"
    return None


def fla_kernels() -> tuple[GatedDeltaNetKernels | None, str]:
    """flash-linear-attention's varlen kernels, or None and why not (not installed, or without ``cu_seqlens``)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        try:
            from fla.modules.causal_conv1d import causal_conv1d
        except ImportError:  # flash-linear-attention before 0.5 kept it in fla.modules.convolution
            from fla.modules.convolution import causal_conv1d
    except Exception as error:  # noqa: BLE001 - ImportError, or Triton failing to import on this machine
        return None, f"flash-linear-attention is not importable ({type(error).__name__}: {error})"
    version = importlib.metadata.version("fla-core") if _installed("fla-core") else "?"
    for function in (causal_conv1d, chunk_gated_delta_rule):
        if "cu_seqlens" not in inspect.signature(function).parameters:
            return None, (
                f"flash-linear-attention {version}'s {function.__name__} takes no cu_seqlens; install "
                f"flash-linear-attention>={FLA_CHECKED} for the varlen kernels"
            )

    def conv(x, weight, bias, activation, cu_seqlens):
        out = causal_conv1d(x=x, weight=weight, bias=bias, activation=activation, cu_seqlens=cu_seqlens)
        return out[0] if isinstance(out, tuple) else out

    def delta_rule(q, k, v, g, beta, cu_seqlens):
        o, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True)
        return o

    return GatedDeltaNetKernels(conv, delta_rule, f"flash-linear-attention {version}"), ""


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


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


def gated_deltanet_varlen_forward(
    module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, kernels: GatedDeltaNetKernels, layout: str
) -> torch.Tensor:
    """The layer's output (1, T, H) for a packed row whose examples end at ``cu_seqlens``."""
    batch, length, _ = hidden_states.shape
    mixed_qkv, z, b, a = _projections(module, hidden_states, layout)
    weight = module.conv1d.weight.squeeze(1)
    mixed_qkv = kernels.conv(mixed_qkv, weight, module.conv1d.bias, module.activation, cu_seqlens)
    key_dim = module.head_k_dim * module.num_k_heads
    query, key, value = torch.split(mixed_qkv, [key_dim, key_dim, module.head_v_dim * module.num_v_heads], dim=-1)
    query = query.reshape(batch, length, -1, module.head_k_dim)
    key = key.reshape(batch, length, -1, module.head_k_dim)
    value = value.reshape(batch, length, -1, module.head_v_dim)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)
    out = kernels.delta_rule(query, key, value, g, beta, cu_seqlens)
    out = module.norm(out.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))
    return module.out_proj(out.reshape(batch, length, -1))
