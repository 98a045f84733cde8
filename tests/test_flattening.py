"""FlatteningCollator: values, dtypes and shapes, equality with transformers, and its errors."""

import numpy as np
import pytest
import torch
from transformers import DataCollatorWithFlattening

from packing_collators import FlatteningCollator


def random_features(seed, n=16, with_labels=True, kind=list):
    rng = np.random.default_rng(seed)
    features = []
    for _ in range(n):
        ids = rng.integers(0, 32000, size=int(rng.integers(1, 300)))
        feature = {"input_ids": kind(ids.tolist())}
        if with_labels:
            labels = ids.copy()
            labels[: rng.integers(0, len(ids))] = -100  # completion-only mask
            feature["labels"] = kind(labels.tolist())
        features.append(feature)
    return features


def assert_same_batch(ours, theirs):
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype, key
            assert ours[key].shape == value.shape, key
            assert torch.equal(ours[key], value), key
        else:
            assert ours[key] == value and type(ours[key]) is type(value), key


@pytest.mark.parametrize("with_labels", [True, False])
@pytest.mark.parametrize("kind", [list, np.array, torch.tensor])
@pytest.mark.parametrize("seed", range(5))
def test_same_values_as_transformers_data_collator_with_flattening(seed, kind, with_labels):
    features = random_features(seed, with_labels=with_labels, kind=kind)
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(features)
    ours = FlatteningCollator(return_seq_idx=True)(features)
    assert_same_batch(ours, theirs)


def test_same_values_as_transformers_numpy_and_position_start():
    features = random_features(7)
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, position_ids_start=2, return_tensors="np")(features)
    ours = FlatteningCollator(position_ids_start=2, return_tensors="np")(features)
    assert set(ours) == set(theirs)
    for key in theirs:
        np.testing.assert_array_equal(ours[key], theirs[key])
        assert np.asarray(ours[key]).dtype == np.asarray(theirs[key]).dtype


def test_literal_batch_dtypes_and_shapes():
    batch = FlatteningCollator(return_seq_idx=True)(
        [{"input_ids": [11, 12, 13], "labels": [-100, 12, 13]}, {"input_ids": [21, 22], "labels": [21, 22]}]
    )
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22]]
    assert batch["labels"].tolist() == [[-100, 12, 13, -100, 22]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["seq_idx"].tolist() == [[0, 0, 0, 1, 1]]
    assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == [0, 3, 5]
    assert batch["max_length_q"] == batch["max_length_k"] == 3
    assert batch["input_ids"].dtype == batch["labels"].dtype == batch["position_ids"].dtype == torch.int64
    assert batch["cu_seq_lens_q"].dtype == batch["seq_idx"].dtype == torch.int32
    assert "attention_mask" not in batch


def test_padding_is_its_own_segment():
    batch = FlatteningCollator(pad_to_multiple_of=8, pad_token_id=99, return_seq_idx=True)(
        [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 99, 99, 99]]
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 8]
    assert batch["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 2, 2]]


def test_no_padding_when_already_a_multiple():
    batch = FlatteningCollator(pad_to_multiple_of=4)([{"input_ids": [1, 2]}, {"input_ids": [3, 4]}])
    assert batch["cu_seq_lens_q"].tolist() == [0, 2, 4]


@pytest.mark.parametrize("seed", range(5))
def test_tokens_in_equal_tokens_out(seed):
    features = random_features(seed, n=40)
    batch = FlatteningCollator(pad_to_multiple_of=64, return_tensors="np")(features)
    total = sum(len(f["input_ids"]) for f in features)
    assert batch["input_ids"][0, :total].tolist() == [t for f in features for t in f["input_ids"]]
    assert batch["input_ids"].shape[1] % 64 == 0


def test_all_ones_attention_mask_is_accepted_and_not_returned():
    batch = FlatteningCollator()([{"input_ids": [1, 2], "attention_mask": [1, 1]}])
    assert "attention_mask" not in batch


def test_does_not_modify_its_inputs():
    labels = np.array([5, 6, 7])
    FlatteningCollator()([{"input_ids": np.array([5, 6, 7]), "labels": labels}])
    assert labels.tolist() == [5, 6, 7]


@pytest.mark.parametrize(
    "features, match",
    [
        ([], r"empty batch"),
        ([{"input_ids": [1]}, {"labels": [1]}], r"Example 1 has no 'input_ids'"),
        ([{"input_ids": [1, 2]}, {"input_ids": []}], r"Example 1 has no tokens \(1 empty example"),
        ([{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [3]}], r"Example 1 has no 'labels'"),
        ([{"input_ids": [1, 2], "labels": [1]}], r"Example 0: labels has 1 tokens but input_ids has 2"),
        ([{"input_ids": [1], "attention_mask": [1]}, {"input_ids": [1, 2], "attention_mask": [1, 0]}], r"Example 1 has attention_mask zeros"),
    ],
)
def test_bad_batches(features, match):
    with pytest.raises(ValueError, match=match):
        FlatteningCollator()(features)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(return_tensors="tf"), r"return_tensors='tf' is not supported; choose one of 'pt', 'np'"),
        (dict(pad_to_multiple_of=0), r"pad_to_multiple_of must be a positive integer or None, got 0"),
        (dict(pad_to_multiple_of=True), r"pad_to_multiple_of must be a positive integer or None, got True"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FlatteningCollator(**kwargs)
