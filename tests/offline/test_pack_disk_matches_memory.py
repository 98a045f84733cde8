"""Property: the on-disk pack_dataset (``_cache_files`` / ``_disk_rows``) gives the in-memory rows and stats.

Over random inputs (lengths, dtypes, kept columns, empty examples, files of several record batches)
and every strategy and overflow choice, with windows and chunks made tiny so every boundary is hit.
"""

import numpy as np
import pytest
from datasets import Dataset, Features, Sequence, Value, load_from_disk

from packing_collators import pack_dataset
from packing_collators.offline import _arrow_files, _arrow_rows, _disk_rows

CHOICES = [
    (strategy, overflow) for strategy in ("bfd", "ffd", "next_fit") for overflow in ("truncate", "drop", "split")
]
CHOICES += [("wrapped", "error"), ("bfd", "error")]


def random_saved(tmp_path, seed, max_length):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    longest = max_length if rng.random() < 0.3 else 3 * max_length  # sometimes nothing overflows
    lengths = rng.integers(0, longest + 1, n)
    ids = [rng.integers(0, 60_000, k).tolist() for k in lengths]
    dtype = str(rng.choice(["int32", "int64", "uint16"]))
    columns = {"input_ids": ids, "labels": [[t % 977 for t in x] for x in ids], "tag": [f"t{i}" for i in range(n)]}
    features = {"input_ids": Sequence(Value(dtype)), "labels": Sequence(Value("int64")), "tag": Value("string")}
    if rng.random() < 0.5:
        columns["attention_mask"] = [[1] * k for k in lengths]
        features["attention_mask"] = Sequence(Value("int8"))
    data = Dataset.from_dict(columns, features=Features(features))
    data.save_to_disk(str(tmp_path / "data"), num_shards=int(rng.integers(1, 4)), max_shard_size=None)
    saved = load_from_disk(str(tmp_path / "data"))
    if rng.random() < 0.5:  # a map's cache file: many small record batches, so windows end inside files
        batch = int(rng.integers(3, 40))
        saved = saved.map(lambda x: x, batched=True, writer_batch_size=batch, cache_file_name=str(tmp_path / "m.arrow"))
    return saved, lengths


@pytest.mark.parametrize("passes", [1, 2])  # the input read once from its memory map, or through temp files
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("strategy, overflow", CHOICES)
def test_disk_rows_and_stats_equal_the_in_memory_ones(tmp_path, monkeypatch, seed, strategy, overflow, passes):
    monkeypatch.setattr(_disk_rows, "MEMORY_SHARE", 1.0 if passes == 1 else 0.0)
    monkeypatch.setattr(_arrow_files, "WINDOW_TOKENS", 700)
    monkeypatch.setattr(_arrow_rows, "CHUNK_TOKENS", 500)
    monkeypatch.setattr(_disk_rows, "CHUNK_TOKENS_ON_DISK", 300)
    max_length = 48
    data, lengths = random_saved(tmp_path, seed, max_length)
    if overflow == "error" and strategy != "wrapped" and lengths.max() > max_length:
        max_length = int(lengths.max())
    options = dict(strategy=strategy, overflow=overflow, seed=seed, keep_columns=["tag"], return_stats=True)
    options["shuffle_rows"] = seed % 2 == 0
    memory, memory_stats = pack_dataset(data, max_length, keep_in_memory=True, **options)
    disk, disk_stats = pack_dataset(data, max_length, load_from_cache_file=False, **options)
    procs, procs_stats = pack_dataset(data, max_length, load_from_cache_file=False, num_proc=3, **options)
    assert disk.cache_files and procs.cache_files and not memory.cache_files
    assert disk.features == memory.features == procs.features
    assert disk[:] == memory[:] == procs[:]
    assert disk_stats == memory_stats == procs_stats
    kept = sum(len(row) for row in memory["input_ids"])  # nothing lost silently
    lost = memory_stats.truncated_tokens + memory_stats.dropped_tokens
    assert kept == memory_stats.packed_tokens and kept + lost == int(lengths.sum()) == memory_stats.input_tokens
