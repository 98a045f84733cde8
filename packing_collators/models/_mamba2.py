"""Mamba2 layers on varlen kernels: the packed row in two launches (a conv and a scan), exact.

    hidden (1, T, H) -> in_proj -> gate z | xBC | dt
      xBC -> causal_conv1d(cu_seqlens) + activation -> x (heads h, head_dim p) | B, C (groups g, state n)
      dt  -> softplus(dt + dt_bias), clamped to time_step_limit;   A = -exp(A_log)   (per head)
      y   = ssd(x, dt, A, B, C, D, chunk_size, cu_seqlens)       (the SSD scan, ``_ssd.py``, includes D * x)
      out = out_proj(norm(y, z))          (Falcon-H1 without its norm: y * silu(z))

Mamba2's SSD is a gated linear attention with one decay per head and token:

    state_t = exp(A * dt_t) * state_{t-1} + B_t^T (dt_t * x_t)        (n x p per head)
    y_t     = C_t state_t + D * x_t

which mamba-ssm's ``mamba_chunk_scan_combined`` computes (the model's own kernel, boundaries as ``seq_idx``),
and fla's ``chunk_simple_gla`` too, with queries C, keys B (each group's repeated over its heads, as
transformers' ``repeat_interleave``), values ``x * dt``, log decay ``A * dt`` and no scale. The state
restarts at every boundary of ``cu_seqlens``, as does the conv window. The arithmetic is that of
transformers' torch path (``mamba2_chunk_scan``, 5.15 to 5.24): dt, the decay and ``D * x`` in float32,
the gated RMSNorm the layer's own module (grouped or not, as the installed version has it). Layouts:

    mamba2      NemotronHMamba2Mixer, GraniteMoeHybridMambaLayer, BambaMixer, Zamba2MambaMixer, Mamba2Mixer
    falcon_h1   FalconH1Mixer: hidden * ssm_in_multiplier before in_proj, its output * mup_vector,
                the gated RMSNorm optional (mamba_rms_norm) and before or after the gate as its module says

A row laid out with its prompts shared runs each prompt once (``mamba2_shared_forward``): the scan takes no
initial state, so each completion's output gains its prompt's final state's term (``_shared_prefix.py``).
Mamba (1) layers (Jamba, Zamba: a decay per channel and state) are not these; they run per example.
Cost: the two kernels on ``T`` tokens (on fla's simple GLA, B and C repeated to (T, heads, n) each).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._kernels import VarlenKernels, causal_conv, zero_padding

__all__ = ["mamba2_layout", "mamba2_shared_forward", "mamba2_varlen_forward"]

_MAMBA2 = (
    "in_proj", "conv1d", "A_log", "D", "dt_bias", "norm", "out_proj", "num_heads", "head_dim", "n_groups",
    "ssm_state_size", "intermediate_size", "conv_dim", "time_step_limit", "activation",
)  # fmt: skip


def mamba2_layout(module) -> str | None:
    """``"mamba2"`` or ``"falcon_h1"`` when ``module`` is a Mamba2 layer this path computes, else None."""
    if not all(hasattr(module, name) for name in _MAMBA2):
        return None
    if not isinstance(module.A_log, torch.Tensor) or tuple(module.A_log.shape) != (module.num_heads,):
        return None  # Mamba (1): A per channel and state
    if hasattr(module, "mup_vector") and hasattr(module, "ssm_in_multiplier"):
        return "falcon_h1"
    return "mamba2"


def _heads(module, x: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (1, T, h, p); B and C (1, T, g, n)."""
    groups = module.n_groups * module.ssm_state_size
    x, B, C = torch.split(x, [module.intermediate_size, groups, groups], dim=-1)
    x = x.reshape(1, length, -1, module.head_dim)
    return x, B.reshape(1, length, module.n_groups, -1), C.reshape(1, length, module.n_groups, -1)


def mamba2_varlen_forward(
    module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, kernels: VarlenKernels, layout: str,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The layer's output (1, T, H) for a packed row whose examples end at ``cu_seqlens`` (``mask``: (1, T) or None)."""
    conv = lambda xBC: causal_conv(kernels, module.conv1d, xBC, module.activation, cu_seqlens)  # noqa: E731
    return _forward(module, hidden_states, layout, conv, lambda *scan: kernels.ssd(*scan, cu_seqlens), mask)


def mamba2_shared_forward(module, hidden_states: torch.Tensor, scope, kernels: VarlenKernels, layout: str):
    """The layer's output (1, T, H) for a row laid out with its prompts shared, each prompt's tokens through the
    layer once: the conv over the keys' layout, the scan from each prompt's final state (``_shared_prefix.py``)."""
    from ._shared_prefix import on_keys, ssd_from_prompts

    passes = scope.shared_prefix()
    conv = lambda x, cu_seqlens: causal_conv(kernels, module.conv1d, x, module.activation, cu_seqlens)  # noqa: E731
    return _forward(module, hidden_states, layout, lambda xBC: on_keys(scope, conv, xBC, module.conv1d),
                    lambda *scan: ssd_from_prompts(kernels.ssd, passes, *scan))  # fmt: skip


def _forward(module, hidden_states: torch.Tensor, layout: str, conv, ssd, mask=None) -> torch.Tensor:
    """The layer's computation with its sequence mixers given: ``conv(xBC)``, ``ssd(x, dt, A, B, C, D, chunk)``."""
    dtype, length = hidden_states.dtype, hidden_states.shape[1]
    hidden_states = zero_padding(hidden_states, mask)
    if layout == "falcon_h1":
        hidden_states = hidden_states * module.ssm_in_multiplier
    projected = module.in_proj(hidden_states)
    if layout == "falcon_h1":
        projected = projected * module.mup_vector
    gate, xBC, dt = projected.split([module.intermediate_size, module.conv_dim, module.num_heads], dim=-1)
    xBC = zero_padding(conv(xBC), mask)
    x, B, C = _heads(module, xBC, length)
    low, high = module.time_step_limit
    dt = F.softplus(dt.float() + module.dt_bias.float()).clamp(min=low, max=high)  # (1, T, h)
    A = -torch.exp(module.A_log.float())
    y = ssd(x, dt, A, B, C, module.D, getattr(module, "chunk_size", 256)).reshape(1, length, -1)
    if getattr(module, "mamba_rms_norm", True):
        y = module.norm(y, gate)
    else:  # Falcon-H1 without its norm
        y = y * F.silu(gate)
    return module.out_proj(y.to(dtype))
