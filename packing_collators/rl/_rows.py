"""TRL's padded RL batch -> the sequences of one packed row, and the row's per-token values back to TRL's layout.

    input_ids      (B, P + C)   prompts padded left, completions padded right (TRL's GRPO/RLOO batch)
    attention_mask (B, P + C)   1 on each row's real tokens: its prompt then its completion, contiguous
      -> sequence i: the real tokens of row i; labels its completion tokens (the last C columns), -100 elsewhere
      -> groups: consecutive rows with the same prompt (a generation's G completions), laid with it once
         (``share_prompt``) or each whole
    packed per-token values, at the keys' layout's target positions -> (B, C): column j of row i holds the
    value for token P + j (0 where that token is padding or no target), as TRL's own forward returns them

Ties: TRL's padded forward computes a token whose row has the same tokens before it as another row's (a group's
first completion token, completions that start alike) as the same numbers, bit for bit; a packed row computes
them at other offsets, a last bit apart. ``first_same_context`` names, for each completion token, the first row
with the same context, so that a value a threshold compares (TRL's ``top_entropy_quantile`` takes tokens at or
above a quantile, which falls on such ties) is tied as TRL's is.

A target at layout position t is token t + 1's (a causal LM predicts the next token); every sequence lies whole
in the keys' layout (the row's, unshared), so token u of the layout is sequence ``owner[u]``'s real token
``column[u]`` of its row. Cost: one numpy pass over the real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..batch import IGNORE_INDEX, shared_prefix_length

__all__ = ["PaddedRows", "first_same_context", "padded_rows", "row_order"]


@dataclass(frozen=True, eq=False)
class PaddedRows:
    """The sequences of a padded batch and where each of their tokens sits in it.

    Attributes:
        sequences: each row's real tokens (``input_ids``) and completion targets (``labels``).
        owner, column: int64 (Tk,) over the sequences laid whole end to end: each token's row, and its column
            among the completion columns (``column - P``, negative for prompt tokens).
        shape: (B, C) of what TRL's per-token values look like.
    """

    sequences: list[dict]
    owner: np.ndarray
    column: np.ndarray
    shape: tuple[int, int]

    def groups(self, share_prompt: bool) -> list[list[dict]]:
        """The sequences grouped for the shared layout: consecutive rows of one prompt together, else one each.

        >>> rows = padded_rows(torch.tensor([[0, 1, 2, 3], [0, 1, 2, 4], [5, 6, 2, 7]]), torch.ones(3, 4), 2)
        >>> [len(group) for group in rows.groups(True)], [len(group) for group in rows.groups(False)]
        ([2, 1], [1, 1, 1])
        """
        if not share_prompt:
            return [[s] for s in self.sequences]
        groups: list[list[dict]] = []
        for sequence in self.sequences:
            if groups and shared_prefix_length([groups[-1][0], sequence]):
                groups[-1].append(sequence)
            else:
                groups.append([sequence])
        return groups

    def scatter(self, values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(B, C) float: ``values`` (1, Tk), at the keys' layout's target positions (``targets != -100``), put where
        TRL's forward puts them; differentiable in ``values``.

        >>> rows = padded_rows(torch.tensor([[0, 1, 2, 3]]), torch.tensor([[0, 1, 1, 1]]), 2)
        >>> rows.sequences
        [{'input_ids': [1, 2, 3], 'labels': [-100, 2, 3]}]
        >>> rows.scatter(torch.tensor([[0.5, 0.25, 0.0]]), torch.tensor([[2, 3, -100]])).tolist()
        [[0.5, 0.25]]
        """
        where = (targets != IGNORE_INDEX).reshape(-1)
        token = torch.nonzero(where).squeeze(-1).cpu().numpy() + 1  # each target's token in the layout
        owner = torch.as_tensor(self.owner[token], device=values.device)
        column = torch.as_tensor(self.column[token], device=values.device)
        out = values.new_zeros(self.shape)
        return out.index_put((owner, column), values.reshape(-1)[where.to(values.device)])


def padded_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> PaddedRows:
    """The :class:`PaddedRows` of TRL's ``prompt_completion_ids`` and ``attention_mask`` (``logits_to_keep`` = C)."""
    ids, mask = input_ids.cpu().numpy(), attention_mask.cpu().numpy().astype(bool)
    prompt_width = ids.shape[1] - logits_to_keep
    sequences, owner, column = [], [], []
    for i in range(ids.shape[0]):
        columns = np.flatnonzero(mask[i])
        tokens = ids[i, columns]
        completion = columns >= prompt_width
        sequences.append({"input_ids": tokens.tolist(), "labels": np.where(completion, tokens, IGNORE_INDEX).tolist()})
        owner.append(np.full(len(columns), i, dtype=np.int64))
        column.append(columns - prompt_width)
    concat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)  # noqa: E731
    return PaddedRows(sequences, concat(owner), concat(column), (ids.shape[0], logits_to_keep))


def first_same_context(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """int64 (B, C): for each completion token (a real one) the first row whose tokens before it are the same
    (its prompt and its completion so far: a distribution predicted from the same context); the row itself
    for padding.

    >>> ids = torch.tensor([[0, 5, 6, 1, 2], [0, 5, 6, 1, 3], [0, 5, 6, 4, 2], [7, 5, 6, 1, 2]])
    >>> first_same_context(ids, (ids > 0).long(), 2).tolist()  # rows 0-2 share their prompt, 0 and 1 its token 1
    [[0, 0], [0, 0], [0, 2], [3, 3]]
    """
    ids, mask = input_ids.cpu().numpy(), attention_mask.cpu().numpy().astype(bool)
    rows, width = ids.shape
    prompt = width - logits_to_keep
    real = np.where(mask, ids, -1)  # padding as a token of its own: the same padding, the same positions
    _, context = np.unique(real[:, :prompt], axis=0, return_inverse=True)
    out = np.empty((rows, logits_to_keep), dtype=np.int64)
    for j in range(logits_to_keep):
        first = {}
        for i in range(rows):
            out[i, j] = first.setdefault(int(context[i]), i) if mask[i, prompt + j] else i
        _, context = np.unique(np.stack([context.reshape(-1), real[:, prompt + j]], 1), axis=0, return_inverse=True)
    return torch.as_tensor(out, device=input_ids.device)


def row_order(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor | None:
    """int64 (B,): the rows in one order for a set of rows, whatever order they came in (by prompt, then completion,
    compared as their tokens' bytes), None where they already are in it. TRL shuffles a generation's rows before its
    loss scores them a micro-batch at a time, so the rows arrive in another order than the old policy's (and the
    reference's) pass scored them in, and a group's completions apart. In this order a prompt's rows lie together
    (each prompt computed once per micro-batch with ``share_prompt``), and the same rows make the same packed row:
    each sequence meets the same neighbours and offsets in both passes, so its numbers are the same to the bit where
    TRL's padded rows are (RLOO's sequence-level ratio is then exactly 1, as TRL's).

    >>> ids = torch.tensor([[0, 5, 1], [6, 7, 2], [0, 5, 3], [6, 7, 4]])  # prompts [5], [6, 7], [5], [6, 7]
    >>> order = row_order(ids, (ids > 0).long(), 1)
    >>> ids[order].tolist()  # each prompt's rows together
    [[0, 5, 1], [0, 5, 3], [6, 7, 2], [6, 7, 4]]
    >>> shuffled = ids[[3, 0, 2, 1]]
    >>> bool((shuffled[row_order(shuffled, (shuffled > 0).long(), 1)] == ids[order]).all())  # the same rows, one order
    True
    """
    ids, mask = input_ids.cpu().numpy(), attention_mask.cpu().numpy().astype(bool)
    prompt = ids.shape[1] - logits_to_keep
    keys = [(ids[i, :prompt][mask[i, :prompt]].tobytes(), ids[i, prompt:][mask[i, prompt:]].tobytes())
            for i in range(ids.shape[0])]  # fmt: skip
    order = sorted(range(len(keys)), key=keys.__getitem__)
    if order == list(range(len(keys))):
        return None
    return torch.as_tensor(order, dtype=torch.int64, device=input_ids.device)
