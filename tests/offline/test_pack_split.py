"""pack_dataset(overflow="split"): examples longer than max_length cut into pieces, every token kept.

Mirrors ``offline/_row_plan.py``'s ``split_pieces`` and the split path of ``_planning.py``.
"""

import numpy as np
import pyarrow as pa
import pytest
from datasets import Dataset, IterableDataset

from packing_collators import pack_dataset
from packing_collators.offline._row_plan import split_pieces


def long_dataset(seed, n=200, cap=32):
    """Token ids are (example * 10_000 + position), so every token says where it came from."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4 * cap, n)  # about 3/4 of them longer than cap, some empty
    ids = [[i * 10_000 + p for p in range(k)] for i, k in enumerate(lengths)]
    labels = [[t + 5_000 for t in x] for x in ids]
    return Dataset.from_dict({"input_ids": ids, "labels": labels}), lengths


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("strategy", ["bfd", "ffd", "next_fit"])
def test_every_token_kept_in_pieces_of_at_most_max_length(seed, strategy):
    cap = 32
    data, lengths = long_dataset(seed, cap=cap)
    packed, stats = pack_dataset(data, cap, overflow="split", strategy=strategy, seed=seed, return_stats=True)
    pieces = {}  # example -> [(first position, tokens)]
    for row in packed:
        assert len(row["input_ids"]) <= cap
        ends = np.cumsum(row["seq_lengths"])
        for start, end in zip(np.r_[0, ends[:-1]], ends):
            tokens, labels = row["input_ids"][start:end], row["labels"][start:end]
            assert row["position_ids"][start:end] == list(range(end - start))  # positions restart per piece
            assert labels == [-100] + [t + 5_000 for t in tokens[1:]]  # each piece's first label masked
            example, first = divmod(tokens[0], 10_000)
            assert tokens == [example * 10_000 + first + p for p in range(end - start)]  # a contiguous run
            pieces.setdefault(example, []).append((first, end - start))
    for example, length in enumerate(lengths):  # the pieces of each example tile it exactly
        runs = sorted(pieces.get(example, []))
        assert [first for first, _ in runs] == list(range(0, length, cap))
        assert sum(size for _, size in runs) == length
    assert stats.input_tokens == stats.packed_tokens == int(lengths.sum())  # tokens in == tokens out
    assert stats.split_examples == int((lengths > cap).sum())
    assert stats.packed_examples == int((lengths > 0).sum()) and stats.empty_examples == int((lengths == 0).sum())
    assert stats.truncated_tokens == stats.dropped_tokens == 0 and stats.rows == len(packed)


def test_split_pieces_tile_each_example():
    lengths = np.random.default_rng(0).integers(0, 100, 1000)
    pieces = split_pieces(lengths, 16)
    assert np.array_equal(np.bincount(pieces.example, weights=pieces.lengths, minlength=1000), lengths)
    assert pieces.lengths.max() == 16 and pieces.split_examples == int((lengths > 16).sum())


def test_literal_split_rows_and_labels():
    data = Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5, 6], [7, 8]], "labels": [[1, 2, 3, 4, 5, 6], [7, 8]]})
    packed = pack_dataset(data, 4, overflow="split", shuffle_rows=False)
    assert packed[:] == {
        "input_ids": [[1, 2, 3, 4], [5, 6, 7, 8]],
        "labels": [[-100, 2, 3, 4], [-100, 6, -100, 8]],
        "position_ids": [[0, 1, 2, 3], [0, 1, 0, 1]],
        "seq_lengths": [[4], [2, 2]],
    }


def test_split_also_packs_tighter_than_truncate_keeps_tokens():
    data, lengths = long_dataset(7)
    _, truncated = pack_dataset(data, 32, overflow="truncate", return_stats=True)
    _, split = pack_dataset(data, 32, overflow="split", return_stats=True)
    assert truncated.packed_tokens < split.packed_tokens == int(lengths.sum())


def test_the_error_names_split_as_a_fix():
    data = Dataset.from_dict({"input_ids": [[1, 2], [1, 2, 3, 4, 5]]})
    with pytest.raises(ValueError, match=r"Example 1 has 5 tokens, more than max_length=4 .* Pass overflow='split'"):
        pack_dataset(data, 4)


def test_split_is_refused_for_streams_with_the_fix():
    stream = IterableDataset.from_generator(lambda: iter([{"input_ids": [1, 2, 3]}]))
    for source in (stream, iter([{"input_ids": [1, 2, 3]}])):
        with pytest.raises(ValueError, match=r"overflow='split' is not supported when streaming.*overflow='truncate'"):
            pack_dataset(source, 2, overflow="split")
    # wrapped never overflows: every token is kept, cut at row ends, so split is no contradiction there
    rows = list(
        pack_dataset(iter([{"input_ids": [1, 2, 3]}]), 2, strategy="wrapped", overflow="split", shuffle_rows=False)
    )
    assert [r["input_ids"] for r in rows] == [[1, 2], [3]]


def test_split_of_an_unsigned_dataset_keeps_dtype_of_ids():
    table = pa.table({"input_ids": pa.array([[1, 2, 3, 4, 5]], pa.list_(pa.uint16()))})
    packed = pack_dataset(Dataset(table), 2, overflow="split", shuffle_rows=False)
    assert packed.features["input_ids"].feature.dtype == "uint16" and packed["seq_lengths"] == [[2], [2], [1]]
