"""Gated short convolutions (LFM2, LFM2-MoE, LFM3) on the varlen conv: the packed row in one launch, exact.

    hidden (1, T, H) -> in_proj -> B | C | x          (each (1, T, H))
                     -> causal_conv1d(B * x, cu_seqlens)   (depthwise, no activation)
                     -> out_proj(C * conv)

The same computation as transformers' ``Lfm2ShortConv.forward`` (5.15 to 5.24; LFM2-MoE's and LFM3's
are the same code), with the boundaries given to the conv, so its window restarts at every example:
an example's first tokens never see the last ones of the example before it. The layer is found by
its structure: a depthwise causal ``conv`` child whose channels are a third of ``in_proj``'s outputs,
and an ``out_proj``. A row laid out with its prompts shared (``batch.SharedPromptLayout``) projects each
prompt once and runs only the conv on the keys' layout, whose window reads the prompt before each completion
(``short_conv_shared_forward``). Cost: the conv on ``T`` tokens, one launch per layer, no padding.
"""

from __future__ import annotations

import torch

from ._kernels import VarlenKernels, causal_conv, zero_padding
from ._mixers import is_short_convolution

__all__ = ["short_conv_layout", "short_conv_shared_forward", "short_conv_varlen_forward"]


def short_conv_layout(module) -> str | None:
    """``"bcx"`` when ``module`` is a gated short convolution this path computes, else None."""
    conv, in_proj = getattr(module, "conv", None), getattr(module, "in_proj", None)
    if not (is_short_convolution(conv) and isinstance(in_proj, torch.nn.Linear) and hasattr(module, "out_proj")):
        return None
    return "bcx" if in_proj.out_features == 3 * conv.in_channels else None


def short_conv_varlen_forward(
    module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, kernels: VarlenKernels, layout: str,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The layer's output (1, T, H) for a packed row whose examples end at ``cu_seqlens`` (``mask``: (1, T) or None)."""
    B, C, x = module.in_proj(zero_padding(hidden_states, mask)).chunk(3, dim=-1)
    conv = causal_conv(kernels, module.conv, B * x, None, cu_seqlens)
    return module.out_proj(C * conv)


def short_conv_shared_forward(module, hidden_states: torch.Tensor, scope, kernels: VarlenKernels, layout: str):
    """The layer's output (1, T, H) for a row laid out with its prompts shared (``scope``: the call's kv_index,
    q_index and keys' segments): the projections on the row (each prompt once), the conv on the keys' layout."""
    from ._shared_prefix import on_keys

    B, C, x = module.in_proj(hidden_states).chunk(3, dim=-1)
    conv = on_keys(scope, lambda bx, cu: causal_conv(kernels, module.conv, bx, None, cu), B * x, module.conv)
    return module.out_proj(C * conv)
