"""concat_tokens / sequence_lengths: many sequences to one flat int64 array."""

import numpy as np
import pytest
import torch

from packing_collators.collate import concat_tokens, sequence_lengths


@pytest.mark.parametrize("kind", [list, np.array, torch.tensor])
def test_kinds_concatenate_alike(kind):
    seqs = [kind(s) for s in ([1, 2], [3], [4, 5, 6])]
    lengths = sequence_lengths(seqs)
    flat = concat_tokens(seqs, int(lengths.sum()))
    assert lengths.tolist() == [2, 1, 3]
    assert flat.dtype == np.int64 and flat.tolist() == [1, 2, 3, 4, 5, 6]


def test_float_arrays_are_refused():
    with pytest.raises(TypeError, match=r"input_ids must hold integer token ids, got dtype float64"):
        concat_tokens([np.array([1.0, 2.0])], 2)


def test_text_is_refused():
    with pytest.raises(TypeError, match=r"Example 0: input_ids must hold integer token ids, got str 'h'"):
        concat_tokens(["hello"], 5)


def test_unsized_example_is_refused():
    with pytest.raises(
        TypeError, match=r"Example 1: input_ids must be a list, numpy array or tensor of token ids, got int"
    ):
        sequence_lengths([[1], 7])


@pytest.mark.parametrize("kind", [list, tuple, np.array, torch.tensor])
@pytest.mark.parametrize("what", ["input_ids", "labels"])
def test_booleans_are_not_token_ids(kind, what):
    # True/False in a Python list are ints to Python (and to array.fromlist): read as ids 1 and 0 they trained silently.
    with pytest.raises(
        TypeError, match=rf"Example 1: {what} must hold integer token ids, got .*bool.*a mask in the wrong column"
    ):
        concat_tokens([kind([5, 6]), kind([True, False, True])], 5, what=what)


def test_a_list_ending_in_a_boolean_is_refused_and_masks_may_hold_booleans():
    with pytest.raises(
        TypeError, match=r"Example 0: input_ids must hold integer token ids, got bool False at position 2"
    ):
        concat_tokens([[5, 6, False]], 3)
    assert concat_tokens([[True, False, True]], 3, what="attention_mask", allow_bool=True).tolist() == [1, 0, 1]
