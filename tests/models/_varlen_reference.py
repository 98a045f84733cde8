"""Reference simple-GLA and KDA kernels in torch, with the signatures of flash-linear-attention's ``chunk_simple_gla``
and ``chunk_kda`` (the keywords the varlen paths pass; anything else is refused, not ignored).

Each example of the row is its own recurrence (KDA one token at a time, simple GLA unrolled into its causal
matrix): slow, plain, and independent of transformers' chunked torch code and of fla's, so the varlen
paths' wiring (projections, heads, groups, gates, decays, norms) is checked on a CPU against each layer's own forward. ``BLIND_CONV`` and
``BLIND_SCAN`` ignore ``cu_seqlens`` in the conv or in the recurrences (the row one sequence): the
tests' control that every boundary the paths pass matters.
"""

from __future__ import annotations

import dataclasses

import torch
from _gdn_reference import conv, delta_rule

from packing_collators.models._kernels import VarlenKernels
from packing_collators.models._ssd import simple_gla_ssd


def _segments(cu_seqlens, length: int) -> list[tuple[int, int]]:
    bounds = [0, length] if cu_seqlens is None else cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def chunk_simple_gla(
    q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """(o (1, T, H, V), None): state_t = exp(g_t) state_{t-1} + k_t^T v_t, o_t = scale q_t state_t, per example;
    g (1, T, H) per token, or g_gamma (H,) for every token; scale defaults to K^-0.5. Unrolled, as the
    example's causal matrix: o_t = scale sum_{s<=t} exp(g_{s+1} + ... + g_t) (q_t . k_s) v_s."""
    assert initial_state is None and not output_final_state
    assert (g is None) != (g_gamma is None)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    decay = (g[0] if g is not None else g_gamma.expand(q.shape[1], q.shape[2])).float()
    qf, kf, vf = (x[0].float() for x in (q, k, v))
    out = []
    for start, end in _segments(cu_seqlens, q.shape[1]):
        length = end - start
        later = torch.ones(length, length, dtype=torch.bool).tril(-1)[..., None]  # [r, s]: r > s
        # [t, s]: g_{s+1} + ... + g_t, summed from s on (no difference of two long sums: nothing cancels)
        decays = decay[start:end, None].expand(length, length, -1).masked_fill(~later, 0).cumsum(0)
        causal = torch.ones(length, length, dtype=torch.bool).tril()[..., None]
        kept = decays.masked_fill(~causal, float("-inf")).exp()  # (t, s, H)
        scores = torch.einsum("thk,shk->tsh", qf[start:end], kf[start:end]) * kept
        out.append(scale * torch.einsum("tsh,shv->thv", scores, vf[start:end]))
    return torch.cat(out)[None].to(q.dtype), None


def chunk_kda(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
):  # fmt: skip
    """(o (1, T, H, V), each example's last state or None): the gated delta rule with a decay per channel, g (1, T,
    H, K), per example, from its ``initial_state`` (N, H, K, V) where given."""
    qf, kf, vf, gf, bf = (x[0].float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out, finals = [], []
    for n, (start, end) in enumerate(_segments(cu_seqlens, q.shape[1])):
        start_state = None if initial_state is None else initial_state[n].float()
        state = qf.new_zeros(q.shape[2], q.shape[-1], v.shape[-1]) if start_state is None else start_state
        for t in range(start, end):
            state = state * gf[t].exp()[:, :, None]
            delta = (vf[t] - (state * kf[t][:, :, None]).sum(1)) * bf[t][:, None]
            state = state + kf[t][:, :, None] * delta[:, None, :]
            out.append(scale * (qf[t][:, :, None] * state).sum(1))
        finals.append(state)
    return torch.stack(out)[None].to(q.dtype), torch.stack(finals) if output_final_state else None


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, seq_idx=None):
    """mamba-ssm's scan (the keywords the SSD path passes), one token at a time: the state restarts where
    ``seq_idx`` (1, T) changes; y_t = C_t state_t + D x_t, state_t = exp(A dt_t) state_{t-1} + B_t^T dt_t x_t."""
    assert chunk_size >= 16 and seq_idx.dtype == torch.int32 and seq_idx.shape == x.shape[:2]
    repeat = x.shape[2] // B.shape[2]
    xf, dtf = x[0].float(), dt[0].float()
    Bf, Cf = (t[0].float().repeat_interleave(repeat, dim=1) for t in (B, C))  # (T, h, n)
    state, out = None, []
    for t in range(x.shape[1]):
        if t == 0 or seq_idx[0, t] != seq_idx[0, t - 1]:
            state = xf.new_zeros(x.shape[2], B.shape[-1], x.shape[-1])  # (h, n, p)
        decay = torch.exp(A.float() * dtf[t])[:, None, None]
        state = decay * state + Bf[t][:, :, None] * (dtf[t][:, None] * xf[t])[:, None, :]
        y = (Cf[t][:, :, None] * state).sum(1)
        out.append(y if D is None else y + D.float()[:, None] * xf[t])
    return torch.stack(out)[None].to(x.dtype)


REFERENCE = VarlenKernels(
    conv, delta_rule, "reference", "cpu", ssd=simple_gla_ssd(chunk_simple_gla), kda=chunk_kda
)  # fmt: skip


def _blind(kernel):
    def without_boundaries(*args, cu_seqlens=None, **kwargs):
        return kernel(*args, cu_seqlens=None, **kwargs)

    return without_boundaries


def _blind_conv(x, weight, bias, activation, cu_seqlens):
    return conv(x, weight, bias, activation, torch.tensor([0, x.shape[1]]))


# Controls: the conv, or the recurrences, run the row as one sequence (the boundaries ignored).
BLIND_CONV = VarlenKernels(
    _blind_conv, delta_rule, "blind conv", "cpu", ssd=simple_gla_ssd(chunk_simple_gla), kda=chunk_kda
)  # fmt: skip
BLIND_SCAN = VarlenKernels(
    conv, delta_rule, "blind scan", "cpu", ssd=simple_gla_ssd(_blind(chunk_simple_gla)), kda=_blind(chunk_kda)
)  # fmt: skip
PREFIX_REFERENCE = dataclasses.replace(REFERENCE, prefix_states=True)  # its delta rules from initial states, as fla's
