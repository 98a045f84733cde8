"""scale_8b.py's documents, the same for both sides: ours packs them, torchtitan streams them into rows.

Lengths of a standard distribution (``long_tail`` by default: 95% lognormal(5.0, 0.7) + 5% uniform(1500, 8192),
mean about 420 tokens, for 8,192-token rows), tokens from ``_shared.markov_tokens`` (a fixed chain, loss floor
ln 4) over the first ``min(vocab - 1, 128000)`` ids, each document's last token the end-of-text id (``eos``: Llama
3.1's 128001, or the last id of a smaller vocabulary), which torchtitan's varlen flavours read as the boundary::

    documents  [a b c EOS] [d e EOS] [f g h i j EOS] ...
    ours       multipack micro-batches of whole documents, <= 8,192 tokens, one flat row each (FlatteningCollator)
    torchtitan its HuggingFaceTextDataset's way: the documents (rank r takes every world-th of a seeded
               shuffle) end to end, cut into windows of seq_len + 1 tokens: input = w[:-1], labels = w[1:]

``step_imbalance`` and ``targets``: what a multipack plan of them gives each rank and row.

numpy only (``_shared`` is imported for the chain). Cost: an N x (longest) int64 grid while drawing tokens
(3,000 documents x 8,190 = 197 MB), once per process.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from _shared import lengths_of, markov_tokens  # noqa: E402  (benchmarks/ is on sys.path)

LLAMA_EOS = 128001  # <|end_of_text|>


def eos_id(vocab: int) -> int:
    """The end-of-text id for a vocabulary: Llama 3.1's where it exists, else the last id.

    >>> eos_id(128256), eos_id(256)
    (128001, 255)
    """
    return LLAMA_EOS if vocab > LLAMA_EOS else vocab - 1


def documents(distribution: str, count: int, max_length: int, vocab: int, seed: int = 0):
    """(int64 lengths, one int64 token array per document, each ending in ``eos_id(vocab)``).

    >>> lengths, docs = documents("long_tail", 4, 8192, 256)
    >>> lengths.tolist(), [int(d[-1]) for d in docs], all(int(d[:-1].max()) < 255 for d in docs)
    ([90, 61, 5559, 6381], [255, 255, 255, 255], True)
    """
    lengths = np.minimum(lengths_of(distribution, count, seed=seed), max_length).astype(np.int64)
    lengths = np.maximum(lengths, 2)
    tokens = markov_tokens(lengths, min(vocab - 1, 128000), seed=seed)
    for doc in tokens:
        doc[-1] = eos_id(vocab)
    return lengths, tokens


def rank_order(count: int, rank: int, world: int, seed: int) -> np.ndarray:
    """Document indices rank ``rank`` streams: every ``world``-th of a seeded shuffle.

    >>> rank_order(6, 1, 2, seed=0).tolist()
    [2, 4, 1]
    """
    return np.random.default_rng(seed).permutation(count)[rank::world]


def stream_rows(docs: list[np.ndarray], order: np.ndarray, seq_len: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(input, labels) windows of ``seq_len`` tokens, torchtitan's way: the documents of ``order`` end to end, cut
    every ``seq_len + 1`` tokens (the last token of a window is only a label); forever, from the start again.

    >>> docs = [np.array([1, 2, 9]), np.array([3, 9]), np.array([4, 5, 6, 9])]
    >>> rows = stream_rows(docs, np.array([0, 1, 2]), 3)
    >>> [(i.tolist(), l.tolist()) for i, l in (next(rows), next(rows))]
    [([1, 2, 9], [2, 9, 3]), ([9, 4, 5], [4, 5, 6])]
    """
    buffer: list[int] = []
    while True:
        for index in order:
            buffer.extend(docs[index].tolist())
            while len(buffer) >= seq_len + 1:
                window = np.asarray(buffer[: seq_len + 1], dtype=np.int64)
                buffer = buffer[seq_len + 1 :]
                yield window[:-1], window[1:]


def row_documents(row: np.ndarray, eos: int) -> list[int]:
    """Lengths of the documents of a row as torchtitan's varlen metadata cuts it: after each ``eos``, and at the end.

    >>> row_documents(np.array([1, 2, 9, 3, 9, 4]), 9)
    [3, 2, 1]
    """
    ends = np.flatnonzero(row == eos) + 1
    bounds = np.unique(np.concatenate([[0], ends, [len(row)]]))
    return np.diff(bounds).tolist()


def step_imbalance(lengths: np.ndarray, plan, steps: range) -> float:
    """Mean over ``steps`` of (the most tokens a sampler rank gets) / (the mean over the ranks) - 1.

    >>> round(step_imbalance(np.array([4, 4, 2, 6]), [[[0], [1]], [[2], [3]]], range(2)), 4)  # (4/3 - 1 + 6/5 - 1) / 2
    0.2667
    """
    ratios = [max(t) / np.mean(t) - 1 for t in ([int(lengths[r[s]].sum()) for r in plan] for s in steps)]
    return float(np.mean(ratios))


def targets(lengths: np.ndarray, indices) -> int:
    """Tokens with a target in a flat row of these examples: FlatteningCollator masks each example's first."""
    return int(lengths[indices].sum()) - len(indices)
