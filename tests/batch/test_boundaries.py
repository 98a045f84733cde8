"""The one rule that reads a batch's examples: cu_seq_lens_q of one row, else restarting position_ids, else rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packing_collators import FlatteningCollator, PrePackedCollator
from packing_collators.batch import read_layout, segment_count, segment_ids, segment_layout, segment_starts


@pytest.mark.parametrize("seed", range(20))
def test_a_collated_row_reads_the_same_by_cu_seq_lens_and_by_positions(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=rng.integers(1, 12)).tolist()
    batch = FlatteningCollator(pad_to_multiple_of=int(rng.integers(1, 9)))([{"input_ids": [1] * n} for n in lengths])
    by_cu = segment_starts(batch)
    by_positions = segment_starts({"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]})
    assert torch.equal(by_cu, by_positions)
    layout = read_layout(batch)
    assert layout.cu_seq_lens.tolist() == batch["cu_seq_lens_q"].tolist()  # every example, then the padding
    assert layout.lengths[: len(lengths)].tolist() == lengths
    assert int(segment_count(batch)) == layout.count
    assert segment_ids(batch)[0].tolist() == layout.seq_idx().tolist()


def test_rows_of_a_padded_prepacked_batch_are_read_by_their_positions():
    rows = [{"input_ids": [1, 2, 3, 4, 5], "seq_lengths": [3, 2]}, {"input_ids": [6, 7], "seq_lengths": [2]}]
    batch = PrePackedCollator(mode="pad", max_length=6)(rows)
    assert "cu_seq_lens_q" not in batch
    assert read_layout(batch).lengths.tolist() == [3, 2, 1, 2, 4]  # each row's padding: a segment of its own
    assert segment_ids(batch).tolist() == [[0, 0, 0, 1, 1, 2], [3, 3, 4, 4, 4, 4]]
    assert int(segment_count(batch)) == 5


def test_a_batch_without_layout_is_one_example_per_row():
    batch = {"input_ids": torch.ones(3, 4, dtype=torch.long), "attention_mask": torch.ones(3, 4)}
    assert read_layout(batch).lengths.tolist() == [4, 4, 4]
    assert int(segment_count(batch)) == 3


def test_empty_segments_are_no_examples_and_multimodal_positions_are_read_by_their_text_row():
    batch = {"input_ids": torch.zeros(1, 5), "cu_seq_lens_q": torch.tensor([0, 2, 2, 5, 5], dtype=torch.int32)}
    assert read_layout(batch).lengths.tolist() == [2, 3]
    assert int(segment_count(batch)) == 2
    rope = torch.tensor([[0, 1, 2, 0, 1]]).expand(3, 1, 5)  # (3, B, T): the first row numbers the text
    assert read_layout({"input_ids": torch.zeros(1, 5), "position_ids": rope}).lengths.tolist() == [3, 2]


def test_a_sequence_shard_counts_the_whole_rows_examples_once():
    # a shard holds T / n tokens and the global cu_seq_lens: counted, not checked against the shard
    shard = {"input_ids": torch.zeros(1, 4), "cu_seq_lens_q": torch.tensor([0, 5, 7, 8], dtype=torch.int32)}
    assert int(segment_count(shard)) == 3


@pytest.mark.parametrize("cu", [[0, 3, 8], [1, 3, 9], [0, 5, 3, 9]])
def test_boundaries_that_do_not_split_the_row_are_refused(cu):
    with pytest.raises(ValueError, match=r"does not split the batch's 9 tokens .*collate with FlatteningCollator"):
        segment_starts({"input_ids": torch.zeros(1, 9), "cu_seq_lens_q": torch.tensor(cu)})


def test_numpy_batches_read_alike():
    batch = FlatteningCollator(return_tensors="np")([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    assert read_layout(batch).cu_seq_lens.tolist() == segment_layout([3, 2]).cu_seq_lens.tolist() == [0, 3, 5]
    assert segment_starts(batch).tolist() == [[True, False, False, True, False]]
