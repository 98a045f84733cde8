"""What pack_dataset takes in: padded examples are refused at entry, and the input's format comes back out."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from datasets import Dataset, DatasetDict, IterableDataset
from datasets.table import InMemoryTable

from packing_collators import pack_dataset

PADDING_FIX = r"Tokenize with padding=False, or strip the padding"


def padded(n=6, padded_examples=(1, 4), mask_type=None):
    """``n`` examples of 3 tokens; those in ``padded_examples`` end in one pad token (mask 0)."""
    ids = [[i + 1, i + 2, 0 if i in padded_examples else i + 3] for i in range(n)]
    masks = [[1, 1, 0 if i in padded_examples else 1] for i in range(n)]
    if mask_type is None:
        return Dataset.from_dict({"input_ids": ids, "attention_mask": masks})
    table = pa.table({"input_ids": ids, "attention_mask": pa.array(masks).cast(pa.list_(mask_type))})
    return Dataset(InMemoryTable(table))


# --- padded input: refused at entry, naming the example, the count and the fix ---


def test_padded_dataset_names_the_first_padded_example_and_how_many():
    with pytest.raises(
        ValueError,
        match=rf"^Example 1 is padded: its attention_mask has 1 zero\(s\) \(2 of 6 examples have attention_mask zeros\)\. .*{PADDING_FIX}",
    ):
        pack_dataset(padded(), 8)


@pytest.mark.parametrize("mask_type", [pa.bool_(), pa.int8(), pa.float32(), pa.uint8()])
def test_padded_masks_of_any_dtype_are_found(mask_type):
    with pytest.raises(ValueError, match=r"^Example 1 is padded.*2 of 6 examples"):
        pack_dataset(padded(mask_type=mask_type), 8)


def test_padding_is_found_in_selected_and_chunked_tables():
    data = padded(10, padded_examples=(7,))
    subset = data.select([9, 8, 7, 0])  # an indices mapping: example 2 of the subset is the padded one
    with pytest.raises(ValueError, match=r"^Example 2 is padded.*1 of 4 examples"):
        pack_dataset(subset, 8)
    chunked = Dataset(InMemoryTable(pa.concat_tables([data.data.table.slice(0, 5), data.data.table.slice(5)])))
    with pytest.raises(ValueError, match=r"^Example 7 is padded.*1 of 10 examples"):
        pack_dataset(chunked, 8)


def test_padding_is_refused_before_packing_whatever_the_options():
    for kwargs in (
        {"overflow": "truncate"},
        {"overflow": "drop"},
        {"strategy": "wrapped"},
        {"keep_columns": ["attention_mask"]},
    ):
        with pytest.raises(ValueError, match=r"^Example 1 is padded"):
            pack_dataset(padded(), 2, **kwargs)


def test_padded_split_of_a_dataset_dict_is_refused():
    with pytest.raises(ValueError, match=r"^Example 4 is padded.*1 of 6 examples"):
        pack_dataset(DatasetDict(train=padded(padded_examples=()), test=padded(padded_examples=(4,))), 8)


def test_padded_stream_names_the_example_in_the_stream():
    stream = ({"input_ids": [1, 2, 3], "attention_mask": [1, 1, 0] if i in (12, 13) else [1, 1, 1]} for i in range(40))
    rows = pack_dataset(stream, 8, buffer_size=5)
    with pytest.raises(
        ValueError,
        match=rf"^Example 12 is padded.*\(2 of the first 15 examples have attention_mask zeros\)\. .*{PADDING_FIX}",
    ):
        list(rows)


def test_padded_iterable_dataset_is_refused():
    source = padded(20, padded_examples=(9,)).to_iterable_dataset()
    assert isinstance(source, IterableDataset)
    with pytest.raises(ValueError, match=r"^Example 9 is padded.*\(1 of the first 10 examples"):
        list(pack_dataset(source, 8, buffer_size=5))


def test_all_ones_attention_mask_is_accepted_in_memory_and_streaming():
    data = padded(padded_examples=())
    packed = pack_dataset(data, 8, shuffle_rows=False)
    assert all(set(mask) == {1} for mask in packed["attention_mask"])
    rows = list(pack_dataset(iter(data), 8, buffer_size=2))
    assert sum(len(row["attention_mask"]) for row in rows) == 18
    bools = pack_dataset(Dataset(InMemoryTable(pa.table({"input_ids": [[1, 2]], "attention_mask": [[True, True]]}))), 8)
    assert bools["attention_mask"] == [[True, True]]


# --- the input's format is the output's ---


def tokens(n=5):
    return Dataset.from_dict(
        {"input_ids": [[1] * (i + 1) for i in range(n)], "labels": [[2] * (i + 1) for i in range(n)]}
    )


def test_numpy_format_in_numpy_format_out():
    packed = pack_dataset(tokens().with_format("numpy"), 8)
    assert packed.format["type"] == "numpy"
    assert isinstance(packed[0]["input_ids"], np.ndarray) and isinstance(packed[0]["seq_lengths"], np.ndarray)


def test_no_format_stays_no_format():
    packed = pack_dataset(tokens(), 8)
    assert packed.format["type"] is None and isinstance(packed[0]["input_ids"], list)


def test_format_columns_kwargs_and_output_all_columns_are_kept():
    data = tokens().with_format("torch", columns=["input_ids"], output_all_columns=True, dtype=torch.int32)
    packed = pack_dataset(data, 8)
    fmt = packed.format
    assert (fmt["type"], fmt["output_all_columns"], fmt["format_kwargs"]) == ("torch", True, {"dtype": torch.int32})
    # the columns the user chose, and the ones that hold the packing (without them a row has no boundaries)
    assert fmt["columns"] == ["input_ids", "position_ids", "seq_lengths"]
    row = packed[0]
    assert row["input_ids"].dtype == torch.int32 and isinstance(row["labels"], list)  # labels: unformatted, still there


def test_format_columns_keep_their_order_and_kept_columns():
    data = Dataset.from_dict({"input_ids": [[1, 2], [3]], "source": ["a", "b"]}).with_format(
        "numpy", columns=["source", "input_ids"]
    )
    packed = pack_dataset(data, 8, keep_columns=["source"])
    assert packed.format["type"] == "numpy"
    assert packed.format["columns"] == ["source", "input_ids", "position_ids", "seq_lengths"]
    assert sorted(np.concatenate(packed["source"]).tolist()) == ["a", "b"]


def test_each_split_of_a_dataset_dict_keeps_its_own_format():
    splits = DatasetDict(
        train=tokens().with_format("numpy"),
        test=tokens(3).with_format("torch", columns=["input_ids", "labels"]),
        raw=tokens(2),
    )
    packed = pack_dataset(splits, 8)
    assert (
        packed["train"].format["type"] == "numpy" and packed["train"].format["columns"] == packed["train"].column_names
    )
    assert packed["test"].format["type"] == "torch"
    assert packed["test"].format["columns"] == ["input_ids", "labels", "position_ids", "seq_lengths"]
    assert packed["raw"].format["type"] is None
