"""pack_dataset(num_shards=N, shard_index=i): each machine builds its range of the one global plan.

Mirrors ``offline/_planning.py`` (the shard's rows) and ``_row_plan.RowPlan.rows``.
"""

import numpy as np
import pytest
from datasets import Dataset, concatenate_datasets, load_from_disk

from packing_collators import pack_dataset
from packing_collators.offline._row_plan import shard_bounds


def examples(seed, n=400):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 90, n)
    ids = [rng.integers(0, 1000, k).tolist() for k in lengths]
    return {"input_ids": ids, "labels": [[t + 1 for t in x] for x in ids], "source": [f"s{i}" for i in range(n)]}


OPTIONS = [
    {"strategy": "bfd", "overflow": "truncate"},
    {"strategy": "next_fit", "overflow": "drop", "shuffle_rows": False},
    {"strategy": "wrapped"},
    {"strategy": "ffd", "overflow": "split"},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
@pytest.mark.parametrize("num_shards", [1, 2, 7])
def test_shards_concatenated_are_the_unsharded_result(tmp_path, options, num_shards):
    Dataset.from_dict(examples(num_shards)).save_to_disk(str(tmp_path / "data"), num_shards=3)
    data = load_from_disk(str(tmp_path / "data"))
    whole, stats = pack_dataset(data, 64, keep_columns=["source"], seed=5, return_stats=True, **options)
    shards = []
    for i in range(num_shards):  # built separately, as on separate machines
        shard, shard_stats = pack_dataset(
            data,
            64,
            keep_columns=["source"],
            seed=5,
            num_shards=num_shards,
            shard_index=i,
            return_stats=True,
            **options,
        )
        assert shard.cache_files and shard_stats == stats  # on disk; the statistics are the whole packing's
        assert len(shard) == np.subtract(*shard_bounds(stats.rows, num_shards, i)[::-1])
        shards.append(shard)
    assert concatenate_datasets(shards)[:] == whole[:]
    in_memory = [
        pack_dataset(
            data,
            64,
            keep_columns=["source"],
            seed=5,
            num_shards=num_shards,
            shard_index=i,
            keep_in_memory=True,
            **options,
        )
        for i in range(num_shards)
    ]
    assert concatenate_datasets(in_memory)[:] == whole[:]


def test_more_shards_than_rows_leaves_empty_shards():
    data = Dataset.from_dict({"input_ids": [[1, 2], [3]]})
    shards = [pack_dataset(data, 8, num_shards=3, shard_index=i) for i in range(3)]
    assert [len(s) for s in shards] == [1, 0, 0] and shards[1].column_names == shards[0].column_names


def test_shard_index_out_of_range_and_streams_are_refused():
    data = Dataset.from_dict({"input_ids": [[1, 2], [3]]})
    with pytest.raises(ValueError, match=r"shard_index=2 is out of range for num_shards=2; shards are numbered 0 to 1"):
        pack_dataset(data, 8, num_shards=2, shard_index=2)
    with pytest.raises(ValueError, match=r"num_shards/shard_index are not supported when streaming"):
        pack_dataset(iter([{"input_ids": [1]}]), 8, num_shards=2, shard_index=1)
