"""pack_dataset on Dataset / DatasetDict: every token once, aligned columns, global > per-chunk, errors."""

import numpy as np
import pytest
from datasets import Dataset, DatasetDict, load_from_disk

from packing_collators import PackStats, pack_dataset, pack_lengths


def random_dataset(seed, n=300, max_len=60, with_labels=True, empty=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len, n)
    lengths[rng.choice(n, empty, replace=False)] = 0
    ids = [rng.integers(0, 1000, k).tolist() for k in lengths]
    data = {"input_ids": ids, "attention_mask": [[1] * k for k in lengths], "idx": list(range(n))}
    if with_labels:
        data["labels"] = [[t + 100_000 for t in x] for x in ids]  # label = token + 100000: alignment is visible
    return Dataset.from_dict(data), ids


def examples_of(packed):
    """(example id, tokens, labels or None, mask, positions) for every segment of every row."""
    out = []
    for row in packed:
        ends = np.cumsum(row["seq_lengths"])
        assert ends[-1] == len(row["input_ids"]) == len(row["position_ids"]) == len(row["attention_mask"])
        for k, (start, end) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
            labels = row["labels"][start:end] if "labels" in row else None
            out.append(
                (
                    row["idx"][k],
                    row["input_ids"][start:end],
                    labels,
                    row["attention_mask"][start:end],
                    row["position_ids"][start:end],
                )
            )
    return out


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "next_fit"])
@pytest.mark.parametrize("shuffle_rows", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_every_example_once_with_aligned_columns(strategy, shuffle_rows, seed):
    data, ids = random_dataset(seed, empty=3)
    packed, stats = pack_dataset(
        data, 64, strategy=strategy, shuffle_rows=shuffle_rows, keep_columns=["idx"], return_stats=True, seed=seed
    )
    seen = examples_of(packed)
    assert sorted(s[0] for s in seen) == [i for i, x in enumerate(ids) if x]  # every non-empty example once
    for idx, tokens, labels, mask, positions in seen:
        assert tokens == ids[idx]
        assert labels == [-100] + [t + 100_000 for t in ids[idx][1:]]
        assert mask == [1] * len(tokens) and positions == list(range(len(tokens)))
    assert all(len(row) <= 64 for row in packed["input_ids"])
    assert stats.rows == len(packed) and stats.empty_examples == 3 and stats.examples == 300
    assert stats.packed_tokens == stats.input_tokens == sum(map(len, ids))


def test_rows_in_packing_order_without_shuffle_and_seeded_shuffle_with():
    data, ids = random_dataset(0, with_labels=False)
    lengths = [len(x) for x in ids]
    packed = pack_dataset(data, 64, shuffle_rows=False, keep_columns=["idx"])
    assert packed["idx"][:] == pack_lengths(lengths, 64).rows
    first = pack_dataset(data, 64, seed=1, keep_columns=["idx"])["idx"][:]
    again = pack_dataset(data, 64, seed=1, keep_columns=["idx"])["idx"][:]
    other = pack_dataset(data, 64, seed=2, keep_columns=["idx"])["idx"][:]
    assert first == again and first != other and sorted(map(tuple, first)) == sorted(map(tuple, other))


def test_literal_rows_and_dtypes():
    data = Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "labels": [[1, 2, 3], [4, 5], [6, 7, 8, 9]]}
    )
    packed = pack_dataset(data, 5, shuffle_rows=False)
    assert packed[:] == {
        "input_ids": [[6, 7, 8, 9], [1, 2, 3, 4, 5]],
        "labels": [[-100, 7, 8, 9], [-100, 2, 3, -100, 5]],
        "position_ids": [[0, 1, 2, 3], [0, 1, 2, 0, 1]],
        "seq_lengths": [[4], [3, 2]],
    }
    schema = packed.data.table.schema
    assert str(schema.field("position_ids").type) == "list<item: int32>"
    assert str(schema.field("seq_lengths").type) == "list<item: int32>"
    assert schema.field("input_ids").type == data.data.table.schema.field("input_ids").type


def test_global_packing_beats_per_chunk_packing(standard_lengths):
    lengths = standard_lengths("sft", 5000)
    data = Dataset.from_dict({"input_ids": [[1] * k for k in lengths]})
    _, stats = pack_dataset(data, 2048, return_stats=True)
    per_chunk_rows = sum(pack_lengths(lengths[i : i + 1000], 2048).num_rows for i in range(0, 5000, 1000))
    assert stats.rows < per_chunk_rows
    assert stats.efficiency > stats.packed_tokens / (per_chunk_rows * 2048)
    assert stats.rows - stats.lower_bound_rows <= 1


def test_truncate_and_drop_are_counted():
    data = Dataset.from_dict({"input_ids": [[1] * 3, [2] * 9, [3] * 4, []]})
    packed, stats = pack_dataset(data, 5, overflow="truncate", shuffle_rows=False, return_stats=True)
    assert sorted(packed["input_ids"][:]) == [[1, 1, 1], [2] * 5, [3] * 4]
    assert (stats.truncated_examples, stats.truncated_tokens, stats.empty_examples) == (1, 4, 1)
    packed, stats = pack_dataset(data, 5, overflow="drop", return_stats=True)
    assert sum(map(len, packed["input_ids"][:])) == 7
    assert (stats.dropped_examples, stats.dropped_tokens, stats.packed_examples) == (1, 9, 2)


def test_wrapped_keeps_every_token_in_order_and_full_rows():
    data, ids = random_dataset(1, n=50)
    packed, stats = pack_dataset(
        data, 32, strategy="wrapped", shuffle_rows=False, keep_columns=["idx"], return_stats=True
    )
    stream = [t for x in ids for t in x]
    assert [t for row in packed["input_ids"][:] for t in row] == stream
    assert all(len(row) == 32 for row in packed["input_ids"][:-1])
    labels = [t for row in packed["labels"][:] for t in row]
    starts = set(np.cumsum([0] + [len(x) for x in ids[:-1]]).tolist())
    assert labels == [-100 if i in starts else t + 100_000 for i, t in enumerate(stream)]
    for row in packed:  # positions restart for each fragment, one idx per fragment
        ends = np.cumsum(row["seq_lengths"])
        assert row["position_ids"] == [p for k in row["seq_lengths"] for p in range(k)]
        assert len(row["idx"]) == len(ends)
    assert stats.rows == stats.lower_bound_rows and stats.packed_tokens == len(stream)
    rows_of = {}
    for r, row_ids in enumerate(packed["idx"][:]):
        for i in row_ids:
            rows_of.setdefault(i, set()).add(r)
    assert stats.split_examples == sum(len(rows) > 1 for rows in rows_of.values()) > 0


def test_wrapped_shuffles_examples_and_keeps_tokens():
    data, ids = random_dataset(2, n=80)
    packed = pack_dataset(data.remove_columns("idx"), 32, strategy="wrapped", seed=3)
    flat = [t for row in packed["input_ids"][:] for t in row]
    assert sorted(flat) == sorted(t for x in ids for t in x)
    assert flat != [t for x in ids for t in x]


def test_dataset_dict_packs_each_split():
    train, train_ids = random_dataset(0, n=100)
    test, test_ids = random_dataset(1, n=40)
    packed, stats = pack_dataset(DatasetDict(train=train, test=test), 64, keep_columns=["idx"], return_stats=True)
    assert set(packed) == {"train", "test"} and set(stats) == {"train", "test"}
    assert isinstance(stats["test"], PackStats)
    assert sorted(s[0] for s in examples_of(packed["test"])) == list(range(40))
    assert stats["train"].packed_tokens == sum(map(len, train_ids))


def test_selected_rows_of_a_dataset_are_what_is_packed():
    data, ids = random_dataset(0, n=100)
    subset = data.shuffle(seed=0).select(range(30))
    packed = pack_dataset(subset, 64, keep_columns=["idx"])
    assert sorted(s[0] for s in examples_of(packed)) == sorted(subset["idx"][:])


def test_save_to_disk_and_parquet_keep_everything(tmp_path):
    data, _ = random_dataset(0, n=60)
    packed = pack_dataset(data, 64, keep_columns=["idx"])
    packed.save_to_disk(str(tmp_path / "packed"))
    assert load_from_disk(str(tmp_path / "packed"))[:] == packed[:]
    packed.to_parquet(str(tmp_path / "packed.parquet"))
    assert Dataset.from_parquet(str(tmp_path / "packed.parquet"))[:] == packed[:]


def test_stats_are_logged(caplog):
    data, _ = random_dataset(0, n=20)
    with caplog.at_level("INFO", logger="packing_collators"):
        pack_dataset(data, 64, keep_columns=["idx"])
    assert "efficiency" in caplog.text and "lower bound" in caplog.text


@pytest.mark.parametrize(
    "data, kwargs, error, match",
    [
        ({"text": ["a"]}, {}, ValueError, r"no 'input_ids' column \(its columns: \['text'\]\)"),
        (
            {"input_ids": [[1, 2], [3]], "attention_mask": [[1, 1], [1, 1]]},
            {},
            ValueError,
            r"Example 1: attention_mask has 2 values but input_ids has 1 tokens",
        ),
        ({"input_ids": [[1, 2], [3]], "labels": [[1, 2], [3, 4]]}, {}, ValueError, r"Example 1: labels has 2 values"),
        (
            {"input_ids": [[1] * 9]},
            {},
            ValueError,
            r"Example 0 has 9 tokens, more than max_length=8.*overflow='truncate'.*raise max_length",
        ),
        (
            {"input_ids": [[1]], "source": ["web"]},
            {},
            ValueError,
            r"Column 'source' \(string\) is not a per-token column.*keep_columns=\['source'\]",
        ),
        ({"input_ids": [[1]], "seq_lengths": [[1]]}, {}, ValueError, r"already has a 'seq_lengths' column"),
        ({"input_ids": [[1]]}, {"keep_columns": ["nope"]}, ValueError, r"keep_columns names \['nope'\]"),
        ({"input_ids": [[1]]}, {"strategy": "best"}, ValueError, r"strategy='best' is not supported"),
        ({"input_ids": [[1]]}, {"overflow": "wrap"}, ValueError, r"overflow='wrap' is not supported"),
        ({"input_ids": [["a"]]}, {}, ValueError, r"Column 'input_ids' .* is not a per-token column"),
        ({"input_ids": [[1.5]]}, {}, TypeError, r"'input_ids' must hold integer token ids"),
        ({"input_ids": [[1], None]}, {}, ValueError, r"Example 1 has no input_ids \(null\)"),
    ],
)
def test_bad_inputs_give_clear_errors(data, kwargs, error, match):
    with pytest.raises(error, match=match):
        pack_dataset(Dataset.from_dict(data), 8, **kwargs)


def test_bad_arguments():
    data = Dataset.from_dict({"input_ids": [[1]]})
    with pytest.raises(ValueError, match="max_length must be a positive integer, got 0"):
        pack_dataset(data, 0)
    with pytest.raises(TypeError, match="pack_dataset takes a datasets.Dataset"):
        pack_dataset({"input_ids": [[1]]}, 8)


def test_numpy_integer_options_are_plain_ints_in_the_stats():
    data = Dataset.from_dict({"input_ids": [[1, 2], [3]]})
    _, stats = pack_dataset(iter(data), np.int64(4), buffer_size=np.int64(8), return_stats=True)
    assert type(stats.capacity) is int


# --- nothing to pack: an empty result and a warning; negative ids refused ------------------------


@pytest.mark.parametrize(
    "data",
    [
        Dataset.from_dict({"input_ids": []}),  # untyped: a null column, packed as int64 lists
        Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[1, 2]]}).select([]),
    ],
    ids=["untyped", "typed"],
)
def test_an_empty_dataset_packs_to_no_rows_with_a_warning(data):
    with pytest.warns(UserWarning, match="the dataset has no examples, so the result has no rows"):
        packed, stats = pack_dataset(data, 8, return_stats=True)
    assert len(packed) == 0 and stats.rows == 0
    assert {"input_ids", "position_ids", "seq_lengths"} <= set(packed.column_names)
    assert packed.features["input_ids"].feature.dtype.startswith("int")


def test_only_empty_examples_pack_to_no_rows_with_a_warning():
    with pytest.warns(UserWarning, match="3 examples are all empty or left out"):
        packed = pack_dataset(Dataset.from_dict({"input_ids": [[], [], []]}), 8)
    assert len(packed) == 0


def test_a_negative_token_id_is_refused_naming_the_example():
    data = Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5], [6, -3]]})
    with pytest.raises(ValueError, match=r"Example 2: input_ids\[1\] = -3 is negative"):
        pack_dataset(data, 8)
    with pytest.raises(ValueError, match=r"Example 1: input_ids\[1\] = -3 is negative"):
        pack_dataset(data.select([0, 2]), 8)
