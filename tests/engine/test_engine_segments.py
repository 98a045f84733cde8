"""One packing representation (engine Segments) and one statistics vocabulary, one name each."""

import ast
import pathlib

import numpy as np
import pyarrow as pa
import pytest

import packing_collators
from packing_collators import MultipackBatchSampler, PackStats, pack_lengths
from packing_collators.collate import FlatteningCollator
from packing_collators.engine import Segments
from packing_collators.offline import read_examples
from packing_collators.offline._row_plan import RowPlan, bin_plan, wrapped_plan
from packing_collators.sampler import EpochPlan, example_lengths, plan_epoch

ENGINE = pathlib.Path(packing_collators.__file__).parent / "engine"


def test_the_three_layouts_are_segments():
    lengths = np.array([5, 2, 4, 1, 3, 6])
    result = pack_lengths(lengths, 8)
    plan = bin_plan(result)
    epoch = plan_epoch(lengths, 8, num_replicas=2, shuffle=False)
    for packing in (result, plan, epoch):
        assert isinstance(packing, Segments)
        assert packing.row_tokens.sum() == packing.total_tokens == lengths[packing.example].sum()
        assert Segments.rows.fget(packing) == [packing.example[a:b].tolist() for a, b in zip(packing.row_offsets, packing.row_offsets[1:])]
    assert not result.skip.any() and not epoch.skip.any()
    assert result.total_tokens == plan.total_tokens == lengths.sum()
    assert epoch.capacity == 8
    assert epoch.row_tokens.tolist() == [8, 8, 5, 7] == (np.add.reduceat(lengths[epoch.example], epoch.row_offsets[:-1])).tolist()
    for name in ("indices", "seq_lengths", "order", "segment_lengths", "row_segments", "batch_tokens", "num_batches"):
        assert not any(hasattr(packing, name) for packing in (result, plan, epoch)), name  # one name each
    assert isinstance(epoch, EpochPlan) and isinstance(plan, RowPlan)


def test_row_range_is_a_slice_of_the_segments():
    plan = wrapped_plan(np.array([3, 5, 2, 7]), 4, order=np.arange(4))
    for first, last in [(0, 2), (1, 3), (2, 5), (4, 4)]:
        part = plan.row_range(first, last)
        assert type(part) is Segments
        assert part.rows == Segments.rows.fget(plan)[first:last]
        assert part.row_tokens.tolist() == plan.row_tokens[first:last].tolist()
        again = plan.rows(first, last)
        assert isinstance(again, RowPlan) and np.array_equal(again.example, part.example)
        assert np.array_equal(again.restarts, plan.restarts[plan.row_offsets[first] : plan.row_offsets[last]])


def test_packing_result_keeps_its_constructor_keywords():
    result = pack_lengths([9, 0, 3, 2], 8, overflow="truncate")
    rebuilt = type(result)(
        capacity=8,
        strategy="bfd",
        example=result.example,
        length=result.length,
        row_offsets=result.row_offsets,
        input_tokens=14,
        truncated_indices=result.truncated_indices,
        empty_indices=result.empty_indices,
    )
    assert rebuilt.rows == result.rows and rebuilt.summary() == result.summary()
    assert rebuilt.num_dropped == 0 and rebuilt.truncated_tokens == 1 and len(rebuilt) == 2 and rebuilt[0] == result[0]


def test_packing_result_stats_speak_the_packstats_vocabulary():
    result = pack_lengths([9, 0, 3, 2, 12], 8, overflow="drop")
    stats = result.stats()
    assert type(stats) is dict
    assert stats == PackStats.from_result(result).as_dict() == result.pack_stats().as_dict()
    assert (stats["packed_examples"], stats["dropped_examples"], stats["empty_examples"]) == (2, 2, 1)
    assert stats["rows_over_lower_bound"] == 0.0 and "examples_packed" not in stats


def test_bins_left_out_by_drop_last_are_counted_under_their_own_keys():
    lengths = np.arange(1, 41)
    epoch = plan_epoch(lengths, 50, num_replicas=4, drop_last=True, seed=1).stats()
    sampler = MultipackBatchSampler(lengths, 50, num_replicas=4, rank=0, drop_last=True, seed=1).stats()
    for stats in (epoch, sampler):
        assert type(stats) is dict and stats["drop_last_examples"] > 0 and stats["drop_last_tokens"] > 0
        assert "dropped_examples" not in stats  # the engine's key, for examples over the budget
    assert sampler["epoch"] == 0


def test_the_stats_module_imports_no_other_engine_module():
    tree = ast.parse((ENGINE / "_stats.py").read_text())
    relative = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    packaged = [
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    ] + [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level]
    assert relative == [] and not [name for name in packaged if name.startswith("packing_collators")]


def test_padding_is_refused_in_one_wording_by_collators_and_pack_dataset():
    features = [{"input_ids": [5, 6]}, {"input_ids": [7, 8, 0], "attention_mask": [1, 1, 0]}]
    table = pa.Table.from_pylist([{**f, "attention_mask": f.get("attention_mask", [1] * len(f["input_ids"]))} for f in features])
    messages = []
    for run in (lambda: FlatteningCollator()(features), lambda: read_examples(table)):
        with pytest.raises(ValueError, match=r"^Example 1 is padded: its attention_mask has 1 zero\(s\) \(1 of 2 examples") as error:
            run()
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_example_lengths_reads_any_map_style_dataset():
    from datasets import Dataset

    rows = [{"input_ids": [1, 2, 3]}, {"input_ids": [4]}]
    assert example_lengths(rows).tolist() == example_lengths(Dataset.from_list(rows)).tolist() == [3, 1]
    with pytest.raises(ValueError, match=r"^PackingTrainer reads example lengths from the 'labels' column"):
        example_lengths(rows, "labels")
