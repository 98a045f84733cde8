"""Lightning attention (MiniMax) on the varlen simple-GLA kernel: the packed row in one launch, exact.

    hidden (1, T, H) -> act(qkv_proj) -> q, k, v (1, T, h, d)
                     -> ssd(x=v, dt=1, A=-slope_rate, B=k, C=q, D=None, cu_seqlens)   (``_ssd.py``)
                     -> norm -> sigmoid(output_gate(hidden)) * . -> out_proj

MiniMax's lightning attention is a linear attention whose state decays by a fixed rate per head:

    state_t = exp(-slope_h) * state_{t-1} + k_t^T v_t,     o_t = q_t state_t      (no 1/sqrt(d))

which transformers' ``MiniMaxLightningAttention.forward`` (5.15 to 5.24) computes block by block
(``query_decay``, ``key_decay``, ``diagonal_decay``), and which is Mamba2's SSD scan with a step of 1, a decay
``A = -slope`` per head, keys as B and queries as C (one group per head) and no skip: mamba-ssm's
``mamba_chunk_scan_combined``, or fla's ``chunk_simple_gla``. The layer's own ``slope_rate`` buffer gives the
decay (fla's ``chunk_lightning_attn`` computes another slope from the layer index, so it is not used). Given the
boundaries, the state restarts at every example; with its prompts shared, each prompt runs once and its
completions gain its final state's term (``lightning_shared_forward``, ``_shared_prefix.py``). Cost: one kernel on ``T`` tokens per layer, no padding.
"""

from __future__ import annotations

import torch

from ._kernels import VarlenKernels, zero_padding

__all__ = ["lightning_layout", "lightning_shared_forward", "lightning_varlen_forward"]

_LIGHTNING = ("qkv_proj", "output_gate", "out_proj", "norm", "act_fn", "slope_rate", "num_attention_heads", "head_dim")


def lightning_layout(module) -> str | None:
    """``"minimax"`` when ``module`` is a lightning attention layer this path computes, else None."""
    return "minimax" if all(hasattr(module, name) for name in _LIGHTNING) else None


def lightning_varlen_forward(
    module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, kernels: VarlenKernels, layout: str,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """The layer's output ((1, T, H), None: no state to carry) for a packed row whose examples end at ``cu_seqlens``."""
    return _forward(module, hidden_states, lambda *scan: kernels.ssd(*scan, cu_seqlens), mask), None


def lightning_shared_forward(module, hidden_states: torch.Tensor, scope, kernels: VarlenKernels, layout: str):
    """The layer's output ((1, T, H), None) for a row laid out with its prompts shared, each prompt once: the scan
    from each prompt's final state (``_shared_prefix.py``; the layer has no conv)."""
    from ._shared_prefix import ssd_from_prompts

    passes = scope.shared_prefix()
    return _forward(module, hidden_states, lambda *scan: ssd_from_prompts(kernels.ssd, passes, *scan)), None


def _forward(module, hidden_states: torch.Tensor, ssd, mask=None) -> torch.Tensor:
    """The layer's computation with its scan given: ``ssd(x, dt, A, B, C, D, chunk_size)``."""
    length, heads, dim = hidden_states.shape[1], module.num_attention_heads, module.head_dim
    qkv = zero_padding(module.act_fn(module.qkv_proj(hidden_states)), mask).reshape(1, length, heads, 3 * dim)
    query, key, value = torch.split(qkv, dim, dim=3)
    decay = -module.slope_rate.reshape(heads).float()
    steps = torch.ones(1, length, heads, device=hidden_states.device)
    o = ssd(value, steps, decay, key, query, None, 256)
    o = module.norm(o.reshape(1, length, heads * dim))
    o = torch.sigmoid(module.output_gate(hidden_states)) * o
    return module.out_proj(o)
