"""Streaming pack_dataset: the same tokens as the stream, bounded buffering, stats, errors, "wrapped" and its resume."""

import dataclasses
import pickle

import numpy as np
import pyarrow as pa
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
    padded = ({"input_ids": [1, 2], "attention_mask": [1, 0] if i == 9 else [1, 1]} for i in range(12))
    with pytest.raises(ValueError, match=r"Example 9 is padded: .* of the first 10 examples"):
        list(pack_dataset(padded, 8, strategy="wrapped", buffer_size=5))
    with pytest.raises(ValueError, match=r"Column 'idx' \(int64\) is not a per-token column"):
        list(pack_dataset(example_stream(0, 3), 256))
    with pytest.raises(ValueError, match="buffer_size must be a positive integer"):
        pack_dataset(iter([]), 8, buffer_size=0)


def test_empty_stream_yields_nothing():
    rows, stats = pack_dataset(iter([]), 8, return_stats=True)
    assert list(rows) == [] and stats.rows == 0


# ----------------------------------------------------------------------------- wrapped


def wrapped_examples(seed, n, max_length):
    """Random lengths: a fifth empty, some longer than max_length (up to 3 rows), the rest short."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(["empty", "short", "long"], n, p=[0.2, 0.6, 0.2])
    lengths = np.where(kinds == "empty", 0, np.where(kinds == "long", rng.integers(max_length, 3 * max_length, n), 0))
    lengths = np.where(kinds == "short", rng.integers(1, max_length // 2, n), lengths)
    lengths[1] = 0  # an empty example early, whatever the seed
    examples = []
    for i, k in enumerate(lengths):
        ids = rng.integers(0, 1000, int(k)).tolist()
        examples.append({"input_ids": ids, "labels": [t + 100_000 for t in ids], "idx": i})
    return examples


def wrapped_pack(source, max_length, **kwargs):
    return pack_dataset(source, max_length, strategy="wrapped", keep_columns=["idx"], return_stats=True, **kwargs)


def segments_of(rows):
    """(idx, tokens) of every segment, row after row."""
    for row in rows:
        ends = np.cumsum(row["seq_lengths"])
        for k, (start, end) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
            yield row["idx"][k], row["input_ids"][start:end]


@pytest.mark.parametrize("buffer_size", [1, 3, 16, 1000])
def test_wrapped_keeps_every_token_in_order(buffer_size):
    examples = wrapped_examples(0, 120, 32)
    rows, stats = wrapped_pack(iter(examples), 32, buffer_size=buffer_size, shuffle_rows=False)
    rows = list(rows)
    flat = [t for row in rows for t in row["input_ids"]]
    assert flat == [t for ex in examples for t in ex["input_ids"]]  # every token once, in order
    expected_labels = [t + 100_000 if j else -100 for ex in examples for j, t in enumerate(ex["input_ids"])]
    assert [t for row in rows for t in row["labels"]] == expected_labels  # masked exactly at example starts
    row_lengths = [len(row["input_ids"]) for row in rows]
    assert row_lengths[:-1] == [32] * (len(rows) - 1) and 0 < row_lengths[-1] <= 32  # full rows; the last may be short
    for row in rows:
        assert sum(row["seq_lengths"]) == len(row["input_ids"]) == len(row["position_ids"])
        assert row["position_ids"] == [p for n in row["seq_lengths"] for p in range(n)]
    fragments = {}
    for idx, tokens in segments_of(rows):  # each fragment is a segment of its own, tagged with its example
        fragments.setdefault(idx, []).extend(tokens)
    assert fragments == {ex["idx"]: ex["input_ids"] for ex in examples if ex["input_ids"]}
    lengths = np.array([len(ex["input_ids"]) for ex in examples])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    split = int(np.count_nonzero((lengths > 0) & (starts // 32 != (ends - 1) // 32)))
    assert (stats.rows, stats.examples, stats.packed_examples, stats.empty_examples) == (
        len(rows),
        120,
        int(np.count_nonzero(lengths)),
        int(np.count_nonzero(lengths == 0)),
    )
    assert stats.input_tokens == stats.packed_tokens == len(flat) and stats.split_examples == split > 0
    assert stats.rows == stats.lower_bound_rows and stats.strategy == "wrapped"


@pytest.mark.parametrize("buffer_size", [1, 7, 500])
def test_wrapped_stream_gives_the_in_memory_rows(buffer_size):
    examples = wrapped_examples(1, 80, 32)
    memory, memory_stats = wrapped_pack(Dataset.from_list(examples), 32, shuffle_rows=False)
    rows, stats = wrapped_pack(iter(examples), 32, shuffle_rows=False, buffer_size=buffer_size)
    assert list(rows) == memory.to_list() and stats == memory_stats
    # one buffer holding the whole stream: the in-memory rows, shuffled the same way
    memory, memory_stats = wrapped_pack(Dataset.from_list(examples), 32, seed=5)
    rows, stats = wrapped_pack(iter(examples), 32, seed=5, buffer_size=500)
    assert list(rows) == memory.to_list() and stats == memory_stats


def test_wrapped_shuffles_the_examples_of_each_buffer():
    examples = wrapped_examples(2, 60, 32)
    rows, stats = wrapped_pack(iter(examples), 32, buffer_size=10, seed=1)
    rows = list(rows)
    order = []  # examples in the order their tokens come out
    for idx, _ in segments_of(rows):
        if not order or order[-1] != idx:
            order.append(idx)
    nonempty = [ex["idx"] for ex in examples if ex["input_ids"]]
    assert sorted(order) == nonempty  # each non-empty example in one run of consecutive tokens
    assert [t for row in rows for t in row["input_ids"]] == [t for i in order for t in examples[i]["input_ids"]]
    buffers = [i // 10 for i in order]
    assert buffers == sorted(buffers)  # buffer after buffer: examples shuffled within theirs only
    assert order != nonempty  # shuffled within buffers
    assert stats.packed_tokens == stats.input_tokens == sum(len(ex["input_ids"]) for ex in examples)


def wrapped_generator(seed, n, max_length):
    yield from wrapped_examples(seed, n, max_length)


def resumable_sources(seed, n, max_length):
    examples = wrapped_examples(seed, n, max_length)
    yield Dataset.from_list(examples).to_iterable_dataset(num_shards=3)  # Arrow-backed, read as Arrow
    kwargs = {"seed": seed, "n": n, "max_length": max_length}
    yield IterableDataset.from_generator(wrapped_generator, gen_kwargs=kwargs)  # read as Python batches


@pytest.mark.parametrize("shuffle_rows", [False, True])
def test_wrapped_iterable_dataset_resumes_from_its_state_dict(shuffle_rows):
    for source in resumable_sources(3, 90, 32):
        options = dict(buffer_size=7, shuffle_rows=shuffle_rows)
        packed, stats = wrapped_pack(source, 32, **options)
        full = list(packed)
        full_stats = dataclasses.asdict(stats)
        assert len(full) > 20 and stats.rows == len(full)
        for stop in [0, 1, 4, 11, len(full) // 2, len(full) - 1, len(full)]:
            first, _ = wrapped_pack(source, 32, **options)
            rows = iter(first)
            head = [next(rows) for _ in range(stop)]
            state = pickle.loads(pickle.dumps(first.state_dict()))  # as a checkpoint stores it
            resumed, resumed_stats = wrapped_pack(source, 32, **options)
            resumed.load_state_dict(state)
            assert list(pickle.loads(pickle.dumps(resumed))) == full[stop:]  # as a dataloader worker gets it
            assert head + list(resumed) == full, (type(source._ex_iterable).__name__, stop)
            assert dataclasses.asdict(resumed_stats) == full_stats  # the whole run's stats, not the rest's


def test_wrapped_state_carries_less_than_one_row():
    examples = wrapped_examples(4, 200, 32)
    packed, _ = wrapped_pack(Dataset.from_list(examples).to_iterable_dataset(), 32, buffer_size=50)
    carried = []
    for _ in packed:
        carry = packed.state_dict()["examples_iterable"]["buffer"]["carry"]
        if carry is not None:
            table = pa.ipc.open_stream(pa.py_buffer(carry)).read_all()
            carried.append(sum(len(ids) for ids in table.column("input_ids").to_pylist()))
    assert carried and max(carried) < 32


def test_wrapped_bounds_what_is_read_ahead():
    pulled = []
    rows = pack_dataset(
        example_stream(0, 10_000, pulled=pulled), 64, strategy="wrapped", buffer_size=100, keep_columns=["idx"]
    )
    next(rows)
    assert len(pulled) <= 100
    for _ in range(300):
        next(rows)
    assert len(pulled) < 10_000


def test_wrapped_iterable_dataset_dict_and_empty_stream():
    examples = wrapped_examples(5, 30, 32)
    source = IterableDatasetDict(train=Dataset.from_list(examples).to_iterable_dataset())
    packed, stats = wrapped_pack(source, 32, shuffle_rows=False)
    assert [t for row in packed["train"] for t in row["input_ids"]] == [t for ex in examples for t in ex["input_ids"]]
    assert stats["train"].examples == 30
    rows, stats = pack_dataset(iter([]), 8, strategy="wrapped", return_stats=True)
    assert list(rows) == [] and stats.rows == 0
    rows, stats = pack_dataset(iter([{"input_ids": []}] * 3), 8, strategy="wrapped", buffer_size=2, return_stats=True)
    assert list(rows) == [] and (stats.examples, stats.empty_examples) == (3, 3)


# ----------------------------------------------------------------------------- format, nothing to pack


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
@pytest.mark.parametrize("format_type, row_type", [("numpy", np.ndarray), ("torch", "torch"), (None, list)])
def test_a_stream_keeps_its_format(strategy, format_type, row_type):
    import torch

    source = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]}).to_iterable_dataset().with_format(format_type)
    packed = pack_dataset(source, 8, strategy=strategy)
    row = next(iter(packed))
    expected = torch.Tensor if row_type == "torch" else row_type
    assert isinstance(row["input_ids"], expected) and isinstance(row["seq_lengths"], expected)
    assert packed._formatting is None if format_type is None else packed._formatting.format_type == format_type


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_an_empty_stream_warns_that_nothing_was_packed(strategy):
    with pytest.warns(UserWarning, match="the dataset has no examples, so the result has no rows"):
        assert list(pack_dataset(iter([]), 8, strategy=strategy)) == []
    source = Dataset.from_dict({"input_ids": [[1]]}).to_iterable_dataset().filter(lambda example: False)
    with pytest.warns(UserWarning, match="no examples"):
        assert list(pack_dataset(source, 8, strategy=strategy)) == []


def test_a_negative_token_id_in_a_stream_is_numbered_in_the_whole_stream():
    examples = [{"input_ids": [1, 2]}] * 5 + [{"input_ids": [3, -7]}]
    with pytest.raises(ValueError, match=r"Example 5: input_ids\[1\] = -7 is negative"):
        list(pack_dataset(iter(examples), 8, buffer_size=2))
