"""pack_dataset on a Dataset backed by Arrow files: rows written to cache files, reused, row for row the in-memory result.

Mirrors ``offline/_cache_files.py``, ``_arrow_files.py`` and ``_disk_rows.py``.
"""

import json
import logging
import multiprocessing
import os
import re

import numpy as np
import pytest
from datasets import Dataset, DatasetDict, load_from_disk

from packing_collators import pack_dataset
from packing_collators.offline import _arrow_files, _arrow_rows, _disk_rows


@pytest.fixture
def saved(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 120, 600)
    ids = [rng.integers(0, 30_000, k).tolist() for k in lengths]
    data = Dataset.from_dict(
        {"input_ids": ids, "labels": ids, "attention_mask": [[1] * k for k in lengths], "id": list(range(600))}
    )
    data.save_to_disk(str(tmp_path / "data"), num_shards=4)
    return load_from_disk(str(tmp_path / "data"))


def names(dataset):
    return [os.path.basename(f["filename"]) for f in dataset.cache_files]


OPTIONS = [
    {"overflow": "truncate"},
    {"strategy": "wrapped"},
    {"overflow": "split", "strategy": "ffd"},
    {"overflow": "drop", "shuffle_rows": False},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_rows_on_disk_are_the_in_memory_rows(saved, options, monkeypatch):
    monkeypatch.setattr(_arrow_files, "WINDOW_TOKENS", 5_000)  # many windows of input
    monkeypatch.setattr(_arrow_rows, "CHUNK_TOKENS", 4_000)  # and many chunks of output
    monkeypatch.setattr(_disk_rows, "CHUNK_TOKENS_ON_DISK", 3_000)
    memory, memory_stats = pack_dataset(
        saved, 100, keep_columns=["id"], keep_in_memory=True, return_stats=True, **options
    )
    disk, disk_stats = pack_dataset(saved, 100, keep_columns=["id"], return_stats=True, **options)
    assert not memory.cache_files and re.fullmatch(r"cache-[0-9a-f]{16}\.arrow", names(disk)[0])
    assert os.path.dirname(disk.cache_files[0]["filename"]) == os.path.dirname(saved.cache_files[0]["filename"])
    assert disk[:] == memory[:] and disk_stats == memory_stats and disk.features == memory.features
    assert disk._fingerprint == memory._fingerprint  # the same input and options


def test_a_second_call_loads_the_cache_with_its_stats(saved, monkeypatch):
    saved = saved.remove_columns(["id"])
    first, stats = pack_dataset(saved, 100, overflow="split", return_stats=True)
    record = json.loads(open(first.cache_files[0]["filename"][: -len(".arrow")] + ".json").read())
    assert record["files"] == names(first) and record["stats"]["rows"] == stats.rows == len(first)

    def no_packing(*args, **kwargs):
        raise AssertionError("packed again")

    monkeypatch.setattr("packing_collators.offline._cache_files.plan_rows", no_packing)
    again, again_stats = pack_dataset(saved, 100, overflow="split", return_stats=True, num_proc=2, progress=False)
    assert names(again) == names(first) and again_stats == stats and again[:] == first[:]
    with pytest.raises(AssertionError, match="packed again"):  # other options: another fingerprint
        pack_dataset(saved, 100, overflow="split", seed=1)
    with pytest.raises(AssertionError, match="packed again"):
        pack_dataset(saved, 100, overflow="split", load_from_cache_file=False)


def test_num_proc_writes_one_file_per_process_forming_one_dataset(saved):
    single = pack_dataset(saved, 100, overflow="truncate", keep_columns=["id"], keep_in_memory=True)
    parallel = pack_dataset(saved, 100, overflow="truncate", keep_columns=["id"], num_proc=3)
    root = names(parallel)[0][: -len("_00000_of_00003.arrow")]
    assert names(parallel) == [f"{root}_{i:05d}_of_00003.arrow" for i in range(3)] and root.startswith("cache-")
    assert parallel[:] == single[:]


def test_cache_file_name_and_keep_in_memory(saved, tmp_path):
    packed = pack_dataset(
        saved, 100, overflow="drop", keep_columns=["id"], cache_file_name=str(tmp_path / "packed.arrow")
    )
    assert packed.cache_files[0]["filename"] == str(tmp_path / "packed.arrow") and (tmp_path / "packed.json").exists()
    in_memory = Dataset.from_dict(saved[:])  # no cache files: in memory, unless told where to write
    assert not pack_dataset(in_memory, 100, overflow="drop", keep_columns=["id"]).cache_files
    to_file = pack_dataset(
        in_memory, 100, overflow="drop", keep_columns=["id"], cache_file_name=str(tmp_path / "from_memory.arrow")
    )
    assert to_file.cache_files and to_file[:] == packed[:]


def test_a_dataset_that_is_not_its_files_is_read_in_memory_and_logged(saved, caplog):
    shuffled = saved.remove_columns(["id"]).shuffle(seed=0)  # an indices mapping over the files
    with caplog.at_level(logging.INFO, logger="packing_collators"):
        packed = pack_dataset(shuffled, 100, overflow="drop")
    assert "reading the dataset in memory, since it has an indices mapping" in caplog.text
    assert packed.cache_files and packed[:] == pack_dataset(shuffled, 100, overflow="drop", keep_in_memory=True)[:]


def test_column_removals_and_renames_still_read_the_files(saved):
    renamed = saved.rename_column("id", "example").remove_columns(["attention_mask"])
    assert _arrow_files.dataset_arrow_files(renamed)[1]["example"] == "id"
    packed = pack_dataset(renamed, 100, overflow="drop", keep_columns=["example"])
    assert packed[:] == pack_dataset(renamed, 100, overflow="drop", keep_columns=["example"], keep_in_memory=True)[:]
    assert isinstance(_arrow_files.dataset_arrow_files(saved.select(range(10))), str)  # a slice is not the files


def test_large_list_columns_are_read_through_their_64_bit_offsets(tmp_path):
    from datasets import Features, LargeList, Value

    rng = np.random.default_rng(1)
    ids = [rng.integers(0, 1000, k).tolist() for k in rng.integers(1, 40, 300)]
    features = Features({"input_ids": LargeList(Value("int32")), "labels": LargeList(Value("int64"))})
    data = Dataset.from_dict({"input_ids": ids, "labels": ids}, features=features)
    data.save_to_disk(str(tmp_path / "d"), num_shards=3)
    saved = load_from_disk(str(tmp_path / "d"))
    assert saved.cache_files and isinstance(_arrow_files.dataset_arrow_files(saved), tuple)
    on_disk, in_memory = (pack_dataset(saved, 64, overflow="split", keep_in_memory=m) for m in (False, True))
    assert on_disk.cache_files and on_disk[:] == in_memory[:]


def test_errors_on_disk_name_the_example_in_the_whole_dataset(tmp_path):
    ids = [[1, 2]] * 300 + [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    mask = [[1, 1]] * 250 + [[1, 0]] + [[1, 1]] * 49 + [[1] * 9]
    Dataset.from_dict({"input_ids": ids, "attention_mask": mask}).save_to_disk(str(tmp_path / "d"), num_shards=2)
    data = load_from_disk(str(tmp_path / "d"))
    with pytest.raises(ValueError, match=r"Example 250 is padded: .* of the first \d+ examples"):
        pack_dataset(data, 8, overflow="drop")
    good = data.remove_columns(["attention_mask"])
    with pytest.raises(ValueError, match=r"Example 300 has 9 tokens, more than max_length=8 .* overflow='split'"):
        pack_dataset(good, 8)


def test_dataset_dict_splits_each_get_a_cache(saved, tmp_path):
    splits = DatasetDict({"train": saved.remove_columns(["id"]), "test": saved.select_columns(["input_ids"])})
    paths = {"train": str(tmp_path / "train.arrow"), "test": str(tmp_path / "test.arrow")}
    packed = pack_dataset(splits, 100, overflow="drop", cache_file_name=paths)
    assert {name: split.cache_files[0]["filename"] for name, split in packed.items()} == paths
    assert packed["test"].column_names == ["input_ids", "position_ids", "seq_lengths"]
    with pytest.raises(ValueError, match=r"cache_file_name for a DatasetDict is a dict of split name to path"):
        pack_dataset(splits, 100, cache_file_name="x.arrow")


def test_a_cache_file_name_holding_other_options_is_rebuilt_not_loaded(saved, tmp_path):
    path = str(tmp_path / "packed.arrow")
    short = pack_dataset(saved, 100, overflow="drop", keep_columns=["id"], cache_file_name=path)
    longer, stats = pack_dataset(
        saved, 300, overflow="drop", keep_columns=["id"], cache_file_name=path, return_stats=True
    )
    expected = pack_dataset(saved, 300, overflow="drop", keep_columns=["id"], keep_in_memory=True)
    assert longer[:] == expected[:] != short[:] and stats.capacity == 300


def test_a_build_killed_before_its_stats_leaves_no_cache_to_load(saved, tmp_path, monkeypatch):
    path, options = str(tmp_path / "packed.arrow"), {"overflow": "drop", "keep_columns": ["id"]}
    pack_dataset(saved, 100, cache_file_name=path, **options)

    def killed(*args, **kwargs):  # the rows are written, the statistics never are
        raise KeyboardInterrupt

    monkeypatch.setattr("packing_collators.offline._cache_files.json.dump", killed)
    with pytest.raises(KeyboardInterrupt):
        pack_dataset(saved, 300, cache_file_name=path, **options)
    monkeypatch.undo()
    again = pack_dataset(saved, 100, cache_file_name=path, **options)
    assert again[:] == pack_dataset(saved, 100, keep_in_memory=True, **options)[:]


def test_without_madvise_pwrite_or_preadv_the_files_are_still_written(saved, monkeypatch):
    """Windows has none of them, older macOS no ``os.preadv``: plain reads and writes instead."""
    expected = pack_dataset(saved, 100, overflow="split", keep_columns=["id"], keep_in_memory=True)
    monkeypatch.delattr(_arrow_files.mmap, "MADV_DONTNEED")
    monkeypatch.delattr(os, "pwrite")
    monkeypatch.delattr(os, "preadv")
    monkeypatch.setattr(_disk_rows, "MEMORY_SHARE", 0.0)  # two passes: the temp files are written and read
    monkeypatch.setattr(_arrow_files, "WINDOW_TOKENS", 5_000)
    monkeypatch.setattr(_arrow_rows, "CHUNK_TOKENS", 4_000)
    monkeypatch.setattr(_disk_rows, "CHUNK_TOKENS_ON_DISK", 3_000)
    assert pack_dataset(saved, 100, overflow="split", keep_columns=["id"])[:] == expected[:]


def test_an_input_that_fits_in_memory_is_written_once_with_no_temp_file(saved, monkeypatch):
    expected = pack_dataset(saved, 100, overflow="split", keep_columns=["id"], keep_in_memory=True)

    def no_temp_file(*args, **kwargs):
        raise AssertionError("a temp file was written")

    monkeypatch.setattr(_disk_rows.tempfile, "TemporaryFile", no_temp_file)
    monkeypatch.setattr(_arrow_rows, "CHUNK_TOKENS", 4_000)
    monkeypatch.setattr(_disk_rows, "CHUNK_TOKENS_ON_DISK", 3_000)
    assert pack_dataset(saved, 100, overflow="split", keep_columns=["id"])[:] == expected[:]
    monkeypatch.setattr(_disk_rows, "_available_memory", lambda: 0)  # unknown or too little: two passes
    with pytest.raises(AssertionError, match="a temp file was written"):
        pack_dataset(saved, 100, overflow="split", keep_columns=["id"], load_from_cache_file=False)


def _killed_process(*args):  # as the kernel's OOM killer ends a worker: no exception, no cleanup
    os._exit(1)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="the patch reaches workers by fork")
def test_a_num_proc_worker_that_dies_is_an_error_not_a_hang(saved, monkeypatch):
    monkeypatch.setattr("packing_collators.offline._cache_files._write_shard", _killed_process)
    with pytest.raises(RuntimeError, match=r"A num_proc=2 process .* died .* Pass a smaller num_proc"):
        pack_dataset(saved, 100, overflow="drop", keep_columns=["id"], num_proc=2)
    assert not [name for name in os.listdir(os.path.dirname(saved.cache_files[0]["filename"])) if "_of_" in name]


def test_another_library_version_packs_again(saved, monkeypatch):
    """Nothing else in the fingerprint would change if a new release packed differently."""
    first = pack_dataset(saved, 100, overflow="drop", keep_columns=["id"])
    monkeypatch.setattr("packing_collators._version.__version__", "999.0")
    upgraded = pack_dataset(saved, 100, overflow="drop", keep_columns=["id"])
    assert upgraded._fingerprint != first._fingerprint and names(upgraded) != names(first)


def test_keep_in_memory_with_a_cache_file_name_is_refused_not_ignored(tmp_path):
    # the file name was silently ignored; Dataset.map refuses the same pair
    data = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]})
    with pytest.raises(ValueError, match=r"keep_in_memory=True or cache_file_name=.*not both"):
        pack_dataset(data, 8, keep_in_memory=True, cache_file_name=str(tmp_path / "p.arrow"))
