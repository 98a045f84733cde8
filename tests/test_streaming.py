"""Streaming pack_dataset: the same tokens as the stream, bounded buffering, stats, errors."""

import numpy as np
import pytest
from datasets import Dataset, IterableDataset, IterableDatasetDict

from packing_collators import pack_dataset, pack_lengths


def example_stream(seed, n, max_len=120, pulled=None):
    rng = np.random.default_rng(seed)
    for i in range(n):
        if pulled is not None:
            pulled.append(i)
        ids = rng.integers(0, 1000, int(rng.integers(1, max_len))).tolist()
        yield {"input_ids": ids, "labels": [t + 100_000 for t in ids], "idx": i}


def check_rows(rows, n, seed, max_length):
    expected = {ex["idx"]: ex["input_ids"] for ex in example_stream(seed, n)}
    seen = []
    for row in rows:
        assert len(row["input_ids"]) <= max_length
        ends = np.cumsum(row["seq_lengths"])
        assert ends[-1] == len(row["input_ids"]) == len(row["labels"]) == len(row["position_ids"])
        for k, (start, end) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
            idx = row["idx"][k]
            assert row["input_ids"][start:end] == expected[idx]
            assert row["labels"][start:end] == [-100] + [t + 100_000 for t in expected[idx][1:]]
            assert row["position_ids"][start:end] == list(range(end - start))
            seen.append(idx)
    assert sorted(seen) == list(range(n))  # every example exactly once


@pytest.mark.parametrize("buffer_size", [7, 50, 1000])
@pytest.mark.parametrize("strategy", ["bfd", "next_fit"])
def test_generator_yields_the_same_tokens_as_the_stream(buffer_size, strategy):
    rows, stats = pack_dataset(
        example_stream(0, 300), 256, strategy=strategy, buffer_size=buffer_size, keep_columns=["idx"], return_stats=True
    )
    rows = list(rows)
    check_rows(rows, 300, 0, 256)
    assert stats.rows == len(rows) and stats.examples == stats.packed_examples == 300
    assert stats.packed_tokens == stats.input_tokens == sum(len(r["input_ids"]) for r in rows)


def test_iterable_dataset_in_iterable_dataset_out_and_reiterable():
    source = IterableDataset.from_generator(example_stream, gen_kwargs={"seed": 1, "n": 200})
    packed, stats = pack_dataset(source, 256, buffer_size=64, keep_columns=["idx"], return_stats=True)
    assert isinstance(packed, IterableDataset)
    first = list(packed)
    check_rows(first, 200, 1, 256)
    assert list(packed) == first and stats.rows == len(first)  # seeded: the same rows every pass; stats per pass


def test_iterable_dataset_dict_packs_each_split():
    source = IterableDatasetDict(
        train=Dataset.from_list(list(example_stream(0, 50))).to_iterable_dataset(),
        test=Dataset.from_list(list(example_stream(1, 20))).to_iterable_dataset(),
    )
    packed, stats = pack_dataset(source, 256, keep_columns=["idx"], return_stats=True)
    check_rows(list(packed["test"]), 20, 1, 256)
    assert set(stats) == {"train", "test"}


def test_buffer_bounds_what_is_read_ahead():
    pulled = []
    rows = pack_dataset(example_stream(0, 10_000, pulled=pulled), 256, buffer_size=100, keep_columns=["idx"])
    next(rows)
    assert len(pulled) <= 100  # the first rows come out after one buffer, not after the whole stream
    for _ in range(50):
        next(rows)
    assert len(pulled) < 10_000


def test_efficiency_close_to_global_packing(standard_lengths):
    lengths = standard_lengths("sft", 3000)
    stream = ({"input_ids": [1] * int(k)} for k in lengths)
    rows, stats = pack_dataset(stream, 2048, buffer_size=500, return_stats=True)
    assert sum(1 for _ in rows) == stats.rows
    global_rows = pack_lengths(lengths, 2048).num_rows
    assert global_rows <= stats.rows <= global_rows * 1.01 + 2


def test_truncation_and_empty_examples_counted_once():
    stream = iter([{"input_ids": [1] * 5}, {"input_ids": []}, {"input_ids": [2] * 20}, {"input_ids": [3] * 3}])
    rows, stats = pack_dataset(stream, 8, overflow="truncate", buffer_size=2, return_stats=True)
    assert sorted(r["input_ids"] for r in rows) == [[1] * 5 + [3] * 3, [2] * 8]
    assert (stats.truncated_examples, stats.truncated_tokens, stats.empty_examples, stats.examples) == (1, 12, 1, 4)


def test_errors_name_the_example_in_the_stream():
    stream = ({"input_ids": [1] * (50 if i == 12 else 3)} for i in range(20))
    with pytest.raises(ValueError, match=r"Example 12 has 50 tokens, more than max_length=8"):
        list(pack_dataset(stream, 8, buffer_size=5))
    ragged = ({"input_ids": [1, 2], "attention_mask": [1] * (3 if i == 7 else 2)} for i in range(10))
    with pytest.raises(ValueError, match=r"Example 7: attention_mask has 3 values but input_ids has 2"):
        list(pack_dataset(ragged, 8, buffer_size=5))
    with pytest.raises(ValueError, match=r"strategy='wrapped' is not supported when streaming"):
        list(pack_dataset(iter([{"input_ids": [1]}]), 8, strategy="wrapped"))
    with pytest.raises(ValueError, match=r"Column 'idx' \(int64\) is not a per-token column"):
        list(pack_dataset(example_stream(0, 3), 256))
    with pytest.raises(ValueError, match="buffer_size must be a positive integer"):
        pack_dataset(iter([]), 8, buffer_size=0)


def test_empty_stream_yields_nothing():
    rows, stats = pack_dataset(iter([]), 8, return_stats=True)
    assert list(rows) == [] and stats.rows == 0
