"""PreferenceCollator: pairs as one row of sequences, cut as TRL cuts them, bad input named."""

from __future__ import annotations

import pytest
import torch

from packing_collators import PreferenceCollator

PAIR = {"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6, 7, 8]}


def test_each_pair_is_its_chosen_then_its_rejected_sequence_with_completion_targets():
    batch = PreferenceCollator()([PAIR, {"prompt_ids": [9], "chosen_ids": [10], "rejected_ids": [11]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 8, 9, 10, 9, 11]]
    assert batch["labels"].tolist() == [[-100, -100, -100, 4, 5, -100, -100, -100, 6, 7, 8, -100, 10, -100, 11]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 1, 0, 1]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 5, 11, 13, 15]
    assert batch["token_sequence"].tolist() == [[0] * 5 + [1] * 6 + [2] * 2 + [3] * 2]
    assert batch["pair_count"] == 2 and batch["pair_tokens"].tolist() == [11, 4]


@pytest.mark.parametrize("mode, chosen, rejected", [
    ("keep_start", [1, 2, 3, 4], [1, 2, 3, 6]),
    ("keep_end", [2, 3, 4, 5], [3, 6, 7, 8]),
])  # fmt: skip
def test_sequences_are_cut_as_trl_cuts_them(mode, chosen, rejected):
    batch = PreferenceCollator(max_length=4, truncation_mode=mode)([PAIR])
    assert batch["input_ids"].tolist() == [chosen + rejected]


def test_reference_log_probabilities_travel_with_the_pairs():
    pairs = [dict(PAIR, ref_chosen_logps=-1.5, ref_rejected_logps=-2.5)] * 2
    batch = PreferenceCollator()(pairs)
    assert batch["ref_chosen_logps"].tolist() == [-1.5, -1.5] and batch["ref_rejected_logps"].dtype == torch.float32


def test_plain_sequences_are_flattened_as_the_probe_sends_them():
    batch = PreferenceCollator()([{"input_ids": [1, 2]}, {"input_ids": [3]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3]] and "pair_count" not in batch


def test_bad_input_names_the_pair_and_the_fix():
    with pytest.raises(ValueError, match=r"Pair 1 has no 'rejected_ids'.*prompt_ids, chosen_ids and rejected_ids"):
        PreferenceCollator()([PAIR, {"prompt_ids": [1], "chosen_ids": [2]}])
    with pytest.raises(ValueError, match="truncation_mode='middle' is not supported"):
        PreferenceCollator(truncation_mode="middle")
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        PreferenceCollator(max_length=0)
