"""Reference Gated DeltaNet kernels in torch, with the signatures of flash-linear-attention's varlen ones.

Each example of the row is computed on its own (a Python loop over examples and tokens): slow, plain,
and independent of transformers' and fla's code, so the varlen path's wiring (projections, head
layout, conv, gates, norm) is checked on a CPU against the layer's own forward.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from packing_collators.models._gated_deltanet import GatedDeltaNetKernels


def conv(x, weight, bias, activation, cu_seqlens):
    """Causal depthwise conv over each example of x (1, T, D); weight (D, W)."""
    out, width = [], weight.shape[-1]
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        segment = x[:, start:end].transpose(1, 2)
        y = F.conv1d(segment, weight[:, None, :], bias, padding=width - 1, groups=weight.shape[0])[..., : end - start]
        out.append(y.transpose(1, 2))
    y = torch.cat(out, dim=1)
    return F.silu(y) if activation in ("silu", "swish") else y


def delta_rule(q, k, v, g, beta, cu_seqlens, initial_state=None, output_final_state=False):
    """o (1, T, HV, V): the gated delta rule, state reset at every example (to its ``initial_state`` (N, HV, K, V)
    where given), q and k l2-normalised; with ``output_final_state``, (o, each example's last state)."""
    heads = v.shape[2]
    q = q.repeat_interleave(heads // q.shape[2], dim=2).float()
    k = k.repeat_interleave(heads // k.shape[2], dim=2).float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * q.shape[-1] ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    v, g, beta = v.float(), g.float(), beta.float()
    out, finals = [], []
    for n, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
        state = q.new_zeros(heads, q.shape[-1], v.shape[-1]) if initial_state is None else initial_state[n].float()
        for t in range(start, end):
            state = state * g[0, t].exp()[:, None, None]
            remembered = (state * k[0, t][:, :, None]).sum(1)
            delta = (v[0, t] - remembered) * beta[0, t][:, None]
            state = state + k[0, t][:, :, None] * delta[:, None, :]
            out.append((state * q[0, t][:, :, None]).sum(1))
        finals.append(state)
    o = torch.stack(out)[None].to(v.dtype)
    return (o, torch.stack(finals)) if output_final_state else o


REFERENCE = GatedDeltaNetKernels(conv, delta_rule, "reference", device_type="cpu")
PREFIX_REFERENCE = dataclasses.replace(REFERENCE, prefix_states=True)  # as fla's: initial and final states
