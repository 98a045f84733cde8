"""lengths_from_dataset: Arrow list lengths, in the dataset's (mapped) row order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from datasets import Dataset, Features, IterableDataset, List, Value

from packing_collators import lengths_from_dataset


def token_dataset(n: int = 300, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    return Dataset.from_dict({"input_ids": [rng.integers(0, 1000, int(k)).tolist() for k in rng.integers(0, 60, n)]})


def python_lengths(dataset: Dataset, column: str = "input_ids") -> list[int]:
    return [len(row[column]) for row in dataset]


def test_lengths_are_the_row_lengths():
    dataset = token_dataset()
    lengths = lengths_from_dataset(dataset)
    assert lengths.dtype == np.int64 and lengths.shape == (300,)
    assert lengths.tolist() == python_lengths(dataset)


@pytest.mark.parametrize(
    "view",
    [
        lambda ds: ds.select([5, 3, 299, 0, 3]),
        lambda ds: ds.shuffle(seed=1),
        lambda ds: ds.filter(lambda row: len(row["input_ids"]) % 2 == 0),
        lambda ds: ds.train_test_split(test_size=0.25, seed=0)["test"],
        lambda ds: ds.shuffle(seed=2).select(range(10, 60)),
        lambda ds: ds.with_format("torch"),
    ],
)
def test_views_of_a_dataset_give_their_own_row_order(view):
    dataset = view(token_dataset())
    assert lengths_from_dataset(dataset).tolist() == python_lengths(dataset.with_format(None))


def test_large_list_and_fixed_size_list_columns():
    large = pa.table({"input_ids": pa.array([[1, 2], [3], []], type=pa.large_list(pa.int64()))})
    fixed = pa.table({"input_ids": pa.array([[1, 2], [3, 4]], type=pa.list_(pa.int32(), 2))})
    assert lengths_from_dataset(large).tolist() == [2, 1, 0]
    assert lengths_from_dataset(fixed).tolist() == [2, 2]
    assert lengths_from_dataset(Dataset(large)).tolist() == [2, 1, 0]


def test_a_chunked_column_is_read_whole():
    table = pa.concat_tables([pa.table({"input_ids": [[1, 2, 3]]}), pa.table({"input_ids": [[4], [5, 6]]})])
    assert table.column("input_ids").num_chunks == 2
    assert lengths_from_dataset(table).tolist() == [3, 1, 2]


def test_an_integer_column_is_used_as_the_lengths_only_when_named():
    dataset = Dataset.from_dict({"input_ids": [[1, 2, 3], [4]], "length": [30, 10]})
    assert lengths_from_dataset(dataset).tolist() == [3, 1]
    assert lengths_from_dataset(dataset, column="length").tolist() == [30, 10]
    assert lengths_from_dataset(dataset.select([1]), column="length").tolist() == [10]


def test_a_missing_column_is_an_error_listing_the_columns():
    with pytest.raises(ValueError, match=r"no column 'tokens' \(its columns: \['input_ids'\]\)"):
        lengths_from_dataset(token_dataset(3), column="tokens")


def test_a_column_of_another_type_is_an_error():
    dataset = Dataset.from_dict({"text": ["a", "bc"]})
    with pytest.raises(TypeError, match="Column 'text' holds string; it must be a list column"):
        lengths_from_dataset(dataset, column="text")


def test_a_null_row_is_an_error_naming_it():
    features = Features({"input_ids": List(Value("int32"))})
    dataset = Dataset.from_dict({"input_ids": [[1], [2, 3], None]}, features=features)
    with pytest.raises(ValueError, match="Row 2 has no 'input_ids' \\(null\\)"):
        lengths_from_dataset(dataset)


@pytest.mark.parametrize("thing", [[[1, 2], [3]], {"input_ids": [[1]]}])
def test_something_that_is_not_a_dataset_is_a_type_error(thing):
    with pytest.raises(TypeError, match="needs a datasets.Dataset"):
        lengths_from_dataset(thing)


def test_an_iterable_dataset_is_a_type_error_with_the_fix():
    iterable = IterableDataset.from_generator(lambda: iter([{"input_ids": [1, 2]}]))
    with pytest.raises(TypeError, match="An IterableDataset has no lengths before it is read"):
        lengths_from_dataset(iterable)
