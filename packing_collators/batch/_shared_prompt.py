"""The shared-prompt layout: N completions of one prompt, the prompt once in the row, once per completion in the keys.

A group of three sequences ``P C1``, ``P C2``, ``P C3`` (one prompt P, p tokens; whole lengths s1, s2, s3)::

    row (queries)   [ P C1 | C2 | C3 ]           queries' segments  [s1, s2 - p, s3 - p]   (cu_seq_lens_q)
    keys            [ P C1 | P C2 | P C3 ]       keys' segments     [s1, s2, s3]           (cu_seq_lens_k)
    kv_index        each key's row token:       [0 .. s1-1, 0 .. p-1, s1 .. , 0 .. p-1, ...]
    q_index         each row token's key:       P and C1 their first copy, C2 and C3 their own
    position_ids    [0 .. s1-1, p .. s2-1, p .. s3-1]: each completion continues its prompt's positions
    keys_labels     each sequence's labels over the keys' layout, its first one dropped (no target crosses a
                    boundary): the targets of the unshared layout, read through kv_index
    token_sequence  over the keys' layout: the sequence (0 .. N-1 in the group, counted across groups) of each key

A varlen kernel that gathers the keys by ``kv_index`` with causal masking aligned bottom-right gives each
completion's queries exactly P and itself: the attention of the unshared layout, the prompt computed once.
DPO lays a pair out as a group of two (chosen, rejected); GRPO a prompt's G completions. A group whose
sequences do not all start with the same untrained prefix (a ``keep_end`` cut, an empty prompt) is laid out
unshared in the same row (keys = queries). numpy only; the collators turn the arrays into tensors.
Cost: list concatenations per sequence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._keys import IGNORE_INDEX
from ._layout import SegmentLayout, segment_layout

__all__ = ["SharedPromptLayout", "shared_prefix_length", "shared_prompt_layout"]


def _untrained_prefix(labels) -> int:
    trained = np.nonzero(np.asarray(labels) != IGNORE_INDEX)[0]
    return int(trained[0]) if len(trained) else len(labels)


def shared_prefix_length(group: Sequence[Mapping]) -> int:
    """The prompt every sequence of ``group`` starts with (their equal leading untrained tokens), 0 if they differ
    or if one sequence would be left with nothing after it.

    >>> a = {"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}
    >>> b = {"input_ids": [1, 2, 4, 5], "labels": [-100, -100, 4, 5]}
    >>> shared_prefix_length([a, b]), shared_prefix_length([a, {"input_ids": [9, 2, 4], "labels": [-100, -100, 4]}])
    (2, 0)
    """
    p = _untrained_prefix(group[0]["labels"])
    prompt = list(group[0]["input_ids"][:p])
    for sequence in group:
        ids = sequence["input_ids"]
        if _untrained_prefix(sequence["labels"]) != p or list(ids[:p]) != prompt or len(ids) <= p:
            return 0
    return p


@dataclass(frozen=True, eq=False)
class SharedPromptLayout:
    """The arrays of a batch of groups laid out with their prompts shared (see the module docstring).

    Attributes:
        input_ids, position_ids: int64 (T,) the row.
        kv_index: int64 (Tk,) the row token of each key; q_index: int64 (T,) each row token's key.
        keys_labels, token_sequence: int64 (Tk,) over the keys' layout.
        queries, keys: the two sides' segments (one per sequence), for ``varlen_kwargs(queries, keys)``.
        sequence_lengths: int64 (S,) each sequence's whole length (prompt included), as unshared.
    """

    input_ids: np.ndarray
    position_ids: np.ndarray
    kv_index: np.ndarray
    q_index: np.ndarray
    keys_labels: np.ndarray
    token_sequence: np.ndarray
    queries: SegmentLayout
    keys: SegmentLayout
    sequence_lengths: np.ndarray


def _without_first_target(labels) -> list[int]:
    labels = [int(t) for t in labels]
    return [IGNORE_INDEX, *labels[1:]] if labels else labels


def shared_prompt_layout(groups: Sequence[Sequence[Mapping]]) -> SharedPromptLayout:
    """The shared layout of ``groups``, each a list of sequences (``input_ids``, ``labels``) of one prompt.

    >>> p1 = {"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}
    >>> p2 = {"input_ids": [1, 2, 4, 5], "labels": [-100, -100, 4, 5]}
    >>> p3 = {"input_ids": [1, 2, 6], "labels": [-100, -100, 6]}
    >>> layout = shared_prompt_layout([[p1, p2, p3]])
    >>> layout.input_ids.tolist(), layout.position_ids.tolist()
    ([1, 2, 3, 4, 5, 6], [0, 1, 2, 2, 3, 2])
    >>> layout.kv_index.tolist(), layout.q_index.tolist()
    ([0, 1, 2, 0, 1, 3, 4, 0, 1, 5], [0, 1, 2, 5, 6, 9])
    >>> layout.queries.cu_seq_lens.tolist(), layout.keys.cu_seq_lens.tolist(), layout.token_sequence.tolist()
    ([0, 3, 5, 6], [0, 3, 7, 10], [0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    """
    ids, positions, kv, q_index, labels, owner = [], [], [], [], [], []
    q_lengths, k_lengths, whole = [], [], []
    row = keys = sequence_number = 0
    for group in groups:
        p = shared_prefix_length(group) if len(group) > 1 else 0
        group_start = row  # the row position of the group's prompt (its first sequence's)
        for k, sequence in enumerate(group):
            seq_ids = [int(t) for t in sequence["input_ids"]]
            s = len(seq_ids)
            skip = p if k > 0 else 0  # the first sequence lays the prompt out; the others only their completions
            ids += seq_ids[skip:]
            positions += list(range(skip, s))
            prompt_rows = list(range(group_start, group_start + p)) if skip else []
            own_rows = list(range(row, row + s - skip))
            kv += prompt_rows + own_rows
            q_index += list(range(keys + skip, keys + s))
            labels += _without_first_target(sequence["labels"])
            owner += [sequence_number] * s
            q_lengths.append(s - skip)
            k_lengths.append(s)
            whole.append(s)
            row, keys, sequence_number = row + s - skip, keys + s, sequence_number + 1
    as_int = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    return SharedPromptLayout(
        as_int(ids), as_int(positions), as_int(kv), as_int(q_index), as_int(labels), as_int(owner),
        segment_layout(q_lengths), segment_layout(k_lengths), as_int(whole),
    )  # fmt: skip
