"""A shared-prompt row through a recurrence: each prompt once, its completions from the prompt's final state.

    row      [ P C1 | C2 | C3 ]        the shared-prompt layout (``batch.SharedPromptLayout``)
    pass 1   [ P ]                      from a zero state; its final state S kept
    pass 2   [ C1 | C2 | C3 ]           each from S (a sequence laid out unshared: the whole of it, from zero)

A recurrence reads the prompt only through its state at the prompt's end, so the two passes compute what the
keys' layout ``[ P C1 | P C2 | P C3 ]`` computes, with the prompt run once instead of once per completion.
:func:`shared_prefix` reads the passes from the call's ``kv_index`` / ``q_index`` / keys' segments (the
shared copies of a prompt are the keys whose row token is another key's), :func:`run_from_prompts` runs a
kernel that takes initial states and returns final states (flash-linear-attention's
``chunk_gated_delta_rule``, ``chunk_kda``) over them; a layer's short conv runs on the keys' layout instead
(:func:`on_keys`, cut to the conv's window: a copied prompt's last few tokens). The SSD scan (Mamba2, lightning
attention) takes no states, but its decay is one scalar per head and token, so a completion's output from the
prompt's state S is the zero-state output plus ``C_t exp(A (dt_1 + ... + dt_t)) S``: :func:`ssd_from_prompts` adds
that term, S computed from the prompt's tokens.
Cost: one pass over the keys' index on the host per model call; per layer two kernel calls on the row's two slices
(one group) or on gathers and a scatter (several), the conv on the row plus ``width - 1`` tokens per copied prompt
(and for the SSD two einsums per prompt).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = [
    "KeyWindow", "SharedPrefix", "key_window", "on_keys", "run_from_prompts", "shared_prefix", "ssd_from_prompts",
]


@dataclass(frozen=True, eq=False)
class SharedPrefix:
    """The two passes over a shared-prompt row (row positions, int64; boundaries, int32 as kernels take them).

    Attributes:
        prompt_rows, cu_prompts: the shared prompts' tokens, prompt after prompt, and their boundaries.
        rest_rows, cu_rest: every other token, completion after completion (an unshared sequence whole).
        rest_prompt: (R,) the prompt whose final state each of those segments starts from; -1: a zero state.

    They are made on the host; :meth:`on` copies them to a device once per model call: a copy from the host waits for
    the device, and flash-linear-attention keeps what it derives from a ``cu_seqlens`` (its chunk indices, read back
    to the host) for the same tensor object only, so every layer of the call hands it the same ones.
    """

    prompt_rows: torch.Tensor
    cu_prompts: torch.Tensor
    rest_rows: torch.Tensor
    cu_rest: torch.Tensor
    rest_prompt: torch.Tensor
    split: int | None = None  # the row is [prompts | the rest], in that order (one group): the passes are slices
    _copies: dict = field(default_factory=dict, repr=False)  # device -> these passes there
    _rest_tokens: dict = field(default_factory=dict, repr=False)  # device -> rest_tokens(device)
    # rest_prompt + 1: each rest segment's row of [zero state, prompts' final states], made once, not per layer
    initial_rows: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial_rows", self.rest_prompt + 1)

    def initial_states(self, final: torch.Tensor) -> torch.Tensor:
        """Each rest segment's initial state from the prompts' ``final`` states (P, ...): its prompt's, or zeros.

        >>> passes = SharedPrefix(*(torch.tensor(v) for v in ([0], [0, 1], [1, 2], [0, 1, 2], [0, -1])))
        >>> passes.initial_states(torch.full((1, 2), 5.0)).tolist()
        [[5.0, 5.0], [0.0, 0.0]]
        """
        zero_first = torch.nn.functional.pad(final, (0, 0) * (final.dim() - 1) + (1, 0))  # row 0: a zero state
        return zero_first.index_select(0, self.initial_rows)

    def on(self, device: torch.device) -> SharedPrefix:
        """These passes with their tensors on ``device``, copied once (the same tensors at every later call).

        >>> passes = SharedPrefix(*(torch.tensor([0, 1]) for _ in range(5)))
        >>> moved = passes.on(torch.device("meta"))
        >>> moved.cu_rest.device.type, moved is passes.on(torch.device("meta")), passes.on(torch.device("cpu")) is passes
        ('meta', True, True)
        """
        device = torch.device(device)
        if self.prompt_rows.device == device:
            return self
        if device not in self._copies:
            self._copies[device] = SharedPrefix(
                self.prompt_rows.to(device), self.cu_prompts.to(device), self.rest_rows.to(device),
                self.cu_rest.to(device), self.rest_prompt.to(device), self.split,
            )  # fmt: skip
        return self._copies[device]

    def split_row(self, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each (1, T, ...) tensor's prompt-pass tokens and rest-pass tokens (this object on their device): the
        row's two slices where it is one group (``split``), else gathers.

        >>> passes = SharedPrefix(*(torch.tensor(v) for v in ([0, 1], [0, 2], [2, 3, 4], [0, 3], [0])), split=2)
        >>> prompts, rest = passes.split_row(torch.arange(5.0)[None])
        >>> prompts[0].tolist(), rest[0].tolist()
        ([[0.0, 1.0]], [[2.0, 3.0, 4.0]])
        """
        if self.split is not None:  # one group: views, no gathers (nor their backward's scatters)
            parts = [t.split([self.split, t.shape[1] - self.split], dim=1) for t in tensors]
            return [p for p, _ in parts], [r for _, r in parts]
        prompts = [t.index_select(1, self.prompt_rows) for t in tensors]
        return prompts, [t.index_select(1, self.rest_rows) for t in tensors]

    def join(self, first: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        """The two passes' outputs (1, P, ...) and (1, R, ...) back in row order, (1, P + R, ...)."""
        if self.split is not None:
            return torch.cat([first, rest], dim=1)
        out = first.new_empty((1, first.shape[1] + rest.shape[1], *first.shape[2:]))
        return out.index_copy(1, self.prompt_rows, first).index_copy(1, self.rest_rows, rest)

    def rest_tokens(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """For each token of the rest pass, on ``device`` (made on the host and copied once): the rest pass's token
        before its segment's start (0 for the first segment), whether there is one, and per prompt the rest
        tokens whose segment starts from that prompt's state."""
        key = torch.device(device)
        if key not in self._rest_tokens:
            lengths = self.cu_rest.diff().long()
            starts = self.cu_rest[:-1].long().repeat_interleave(lengths)
            token_prompt = self.rest_prompt.repeat_interleave(lengths)
            per_prompt = [(token_prompt == p).nonzero().squeeze(1).to(device) for p in range(len(self.cu_prompts) - 1)]
            self._rest_tokens[key] = ((starts - 1).clamp(min=0).to(device), (starts > 0).to(device), per_prompt)
        return self._rest_tokens[key]


def _cumulative(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)


def shared_prefix(kv_index: torch.Tensor, q_index: torch.Tensor, cu_keys: torch.Tensor) -> SharedPrefix | None:
    """The passes of a row laid out with its prompts shared; None where no prompt is shared (one pass does).

    >>> from packing_collators.collate import shared_prompt_batch
    >>> group = [{"input_ids": [1, 2, 3], "labels": [-100, -100, 3]},
    ...          {"input_ids": [1, 2, 4, 5], "labels": [-100, -100, 4, 5]}]
    >>> alone = {"input_ids": [7, 8], "labels": [-100, 8]}
    >>> batch = shared_prompt_batch([group, [alone]])   # row: [1 2 3 | 4 5 | 7 8]
    >>> passes = shared_prefix(batch["kv_index"], batch["q_index"], batch["cu_seq_lens_k"])
    >>> passes.prompt_rows.tolist(), passes.rest_rows.tolist(), passes.cu_rest.tolist(), passes.rest_prompt.tolist()
    ([0, 1], [2, 3, 4, 5, 6], [0, 1, 3, 5], [0, 0, -1])
    >>> passes.split  # the prompts lead the row, the rest follows: the passes are its two slices
    2
    >>> other = shared_prompt_batch([[alone], group])   # row: [7 8 | 1 2 3 | 4 5]: the prompt does not lead it
    >>> shared_prefix(other["kv_index"], other["q_index"], other["cu_seq_lens_k"]).split
    """
    kv, q, cu = kv_index.reshape(-1).tolist(), q_index.reshape(-1).tolist(), cu_keys.reshape(-1).tolist()
    segments = []  # (start, end, copied): a keys segment and how many of its first keys copy another's token
    prompts: dict[int, tuple[int, int]] = {}  # the prompt's first row position -> (its pass-1 index, length)
    for start, end in zip(cu[:-1], cu[1:]):
        copied = 0
        while start + copied < end and q[kv[start + copied]] != start + copied:
            copied += 1
        segments.append((start, end, copied))
        if copied:
            prompts.setdefault(kv[start], (len(prompts), copied))
    if not prompts:
        return None
    prompt_rows, rest_rows, rest_lengths, rest_prompt = [None] * len(prompts), [], [], []
    for start, end, copied in segments:
        index, length = prompts.get(kv[start], (-1, 0))
        if index >= 0 and not copied:  # the group's first sequence: its first keys are the prompt's own tokens
            prompt_rows[index] = kv[start : start + length]
        rest_rows += kv[start + length : end]
        rest_lengths.append(end - start - length)
        rest_prompt.append(index)
    flat = [r for rows in prompt_rows for r in rows]
    in_order = flat == list(range(len(flat))) and rest_rows == list(range(len(flat), len(flat) + len(rest_rows)))
    return SharedPrefix(
        prompt_rows=torch.tensor(flat, dtype=torch.int64),
        cu_prompts=_cumulative([len(rows) for rows in prompt_rows]),
        rest_rows=torch.tensor(rest_rows, dtype=torch.int64),
        cu_rest=_cumulative(rest_lengths),
        rest_prompt=torch.tensor(rest_prompt, dtype=torch.int64),
        split=len(flat) if in_order else None,
    )


def run_from_prompts(kernel: Callable, passes: SharedPrefix, *inputs: torch.Tensor) -> torch.Tensor:
    """``kernel(*inputs, cu_seqlens, initial_state=, output_final_state=)`` over the row's tokens (dim 1 of each
    input, (1, T, ...)) in the two passes; its output (1, T, ...) in row order."""
    on = passes.on(inputs[0].device)
    prompts, others = on.split_row(*inputs)
    first, states = kernel(*prompts, on.cu_prompts, output_final_state=True)
    return on.join(first, kernel(*others, on.cu_rest, initial_state=on.initial_states(states)))


@dataclass(frozen=True)
class KeyWindow:
    """The keys' layout cut to what a causal window of ``width`` tokens reads: every sequence whole but a copied
    prompt's (a completion after the group's first), of which only its last ``width - 1`` tokens are kept.

    Attributes:
        rows: int64 (W,) the row position of each kept key;  cu: int32 (S + 1,) the kept keys' segments;
        out: int64 (T,) each row token's position among the kept keys (its own key: never a copy, always kept);
        copies: int64 (C,) the kept keys that copy a prompt's token, and copied: (C,) that token's row position.
    """

    rows: torch.Tensor
    cu: torch.Tensor
    out: torch.Tensor
    copies: torch.Tensor
    copied: torch.Tensor

    def to(self, device) -> KeyWindow:
        return KeyWindow(*(t.to(device) for t in (self.rows, self.cu, self.out, self.copies, self.copied)))


def key_window(kv_index: torch.Tensor, q_index: torch.Tensor, cu_keys: torch.Tensor, width: int) -> KeyWindow:
    """The keys' layout of a shared-prompt row cut to a window of ``width`` (a conv's kernel size), on the host.

    >>> from packing_collators.collate import shared_prompt_batch
    >>> group = [{"input_ids": [1, 2, 3, 4], "labels": [-100, -100, -100, 4]},
    ...          {"input_ids": [1, 2, 3, 5, 6], "labels": [-100, -100, -100, 5, 6]}]
    >>> batch = shared_prompt_batch([group])        # row [1 2 3 4 | 5 6], keys [1 2 3 4 | 1 2 3 5 6]
    >>> w = key_window(batch["kv_index"], batch["q_index"], batch["cu_seq_lens_k"], width=3)
    >>> w.rows.tolist(), w.cu.tolist(), w.out.tolist()  # the copy keeps its prompt's last 2 tokens: [2 3 5 6]
    ([0, 1, 2, 3, 1, 2, 4, 5], [0, 4, 8], [0, 1, 2, 3, 6, 7])
    >>> w.copies.tolist(), w.copied.tolist()  # kept keys 4 and 5 copy row tokens 1 and 2
    ([4, 5], [1, 2])
    """
    kv, q = kv_index.reshape(-1).cpu().long(), q_index.reshape(-1).cpu().long()
    cu = cu_keys.reshape(-1).cpu().long()
    lengths = cu.diff()
    positions = torch.arange(kv.numel())
    segment = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    is_copy = q[kv] != positions  # a key whose row token has its own key elsewhere: a prompt's copy
    copied = torch.zeros(lengths.numel(), dtype=torch.int64).index_add_(0, segment, is_copy.long())
    dropped = (copied - (width - 1)).clamp(min=0)  # a segment's copied keys lead it (``shared_prefix``)
    keep = positions - cu[:-1][segment] >= dropped[segment]
    at = keep.long().cumsum(0) - 1
    copy = keep & is_copy
    return KeyWindow(kv[keep], _cumulative((lengths - dropped).tolist()), at[q], at[copy], kv[copy])


class _ToWindow(torch.autograd.Function):
    """``x.index_select(1, window.rows)`` whose backward gathers each token's own key's gradient and adds only the few
    copies' (``index_select``'s own backward adds every key with atomics: bf16 atomics over the whole row, not
    deterministic)."""

    @staticmethod
    def forward(ctx, x, window: KeyWindow):
        ctx.window = window
        return x.index_select(1, window.rows)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        window = ctx.window
        out = grad.index_select(1, window.out)
        if window.copies.numel():
            out.index_add_(1, window.copied, grad.index_select(1, window.copies))
        return out, None


class _FromWindow(torch.autograd.Function):
    """``y.index_select(1, window.out)`` (each row token's own key: no index twice), its backward a plain scatter."""

    @staticmethod
    def forward(ctx, y, window: KeyWindow):
        ctx.window, ctx.length = window, y.shape[1]
        return y.index_select(1, window.out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        shape = (grad.shape[0], ctx.length, *grad.shape[2:])
        return grad.new_zeros(shape).index_copy_(1, ctx.window.out, grad), None


def on_keys(scope, mixer: Callable, x: torch.Tensor, conv: torch.nn.Module) -> torch.Tensor:
    """``mixer(x laid out as the keys, the keys' boundaries)`` read back at the row's tokens, for a layer's causal
    ``conv`` (its window: the kernel size) that must see each completion's prompt before it: the keys' layout cut to
    that window (:func:`key_window`), so a copied prompt costs ``width - 1`` tokens, not its length."""
    window = scope.key_window(conv.weight.shape[-1], x.device)
    return _FromWindow.apply(mixer(_ToWindow.apply(x, window), window.cu), window)


def ssd_from_prompts(ssd: Callable, passes: SharedPrefix, x, dt, A, B, C, D, chunk_size: int) -> torch.Tensor:
    """``ssd(x, dt, A, B, C, D, chunk_size, cu_seqlens)`` (``_ssd.py``: no initial states) over a shared-prompt row
    (x (1, T, h, p), dt (1, T, h), B and C (1, T, g, n)) in the two passes, each completion's output from its prompt's
    final state: the scan is linear in its state, so the zero-state output gains ``C_t exp(A * sum(dt_1..t)) S``."""
    on = passes.on(x.device)
    (xp, dtp, Bp, Cp), (xr, dtr, Br, Cr) = on.split_row(x, dt, B, C)
    first = ssd(xp, dtp, A, Bp, Cp, D, chunk_size, on.cu_prompts)
    rest = ssd(xr, dtr, A, Br, Cr, D, chunk_size, on.cu_rest)
    states = _ssd_final_states(passes.cu_prompts.tolist(), A, xp[0], dtp[0], Bp[0])
    rest = (rest.float() + _from_states(passes, states, A, dtr[0], Cr[0])[None]).to(first.dtype)
    return on.join(first, rest)


def _ssd_final_states(cu: list[int], A, x, dt, B) -> list[torch.Tensor]:
    """Each prompt's state at its end, float32 (g, h / g, p, n), the heads by their B group:
    ``sum_s exp(A * (dt_s+1 + ... + dt_end)) dt_s x_s B_s``."""
    heads, groups = x.shape[1], B.shape[1]
    states = []
    for start, end in zip(cu[:-1], cu[1:]):
        decay = A.float() * dt[start:end].float()  # (L, h), <= 0
        after = decay.flip(0).cumsum(0).flip(0) - decay  # what each token's contribution decays by until the end
        weighted = x[start:end].float() * (after.exp() * dt[start:end].float())[..., None]  # (L, h, p)
        weighted = weighted.reshape(end - start, groups, heads // groups, -1)
        states.append(torch.einsum("sgkp,sgn->gkpn", weighted, B[start:end].float()))
    return states


def _from_states(passes: SharedPrefix, states: list[torch.Tensor], A, dt, C) -> torch.Tensor:
    """(R, h, p) float32: ``C_t exp(A * (dt_1 + ... + dt_t)) S`` at each rest token whose segment starts from a
    prompt's state S (t counted from the segment's start), 0 elsewhere."""
    heads, device = dt.shape[1], dt.device
    previous, has_previous, per_prompt = passes.rest_tokens(device)
    decay = (A.double() * dt.double()).cumsum(0)  # float64: differences of long sums
    before = decay.index_select(0, previous) * has_previous[:, None]
    since_start = (decay - before).float().exp()  # (R, h): exp(A * (dt_1 + ... + dt_t)) within each segment
    out = torch.zeros((dt.shape[0], heads, states[0].shape[2]), dtype=torch.float32, device=device)
    for state, index in zip(states, per_prompt):
        c = C.index_select(0, index).float()  # (t, g, n)
        read = torch.einsum("tgn,gkpn->tgkp", c, state)
        out = out.index_add(0, index, read.reshape(len(index), heads, -1) * since_start.index_select(0, index)[..., None])
    return out
