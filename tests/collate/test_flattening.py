"""FlatteningCollator: values, dtypes and shapes, equality with transformers, and its errors."""

import re
import warnings

import numpy as np
import pytest
import torch
from transformers import DataCollatorWithFlattening

from packing_collators import FlatteningCollator, PrePackedCollator


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
    assert ours.pop("use_cache") is False  # ours also turns the KV cache off (transformers' collator does not)
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
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, position_ids_start=2, return_tensors="np")(
        features
    )
    ours = FlatteningCollator(position_ids_start=2, return_tensors="np")(features)
    assert ours.pop("use_cache") is False
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
        ([{"input_ids": [1, 2]}, {"input_ids": []}], r"Example 1 of this batch \(its place among the batch.s 2, in the sampler.s order\) has no tokens \(1 empty example"),
        ([{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [3]}], r"Example 1 has no 'labels'"),
        ([{"input_ids": [1, 2], "labels": [1]}], r"Example 0: labels has 1 tokens but input_ids has 2"),
        (
            [{"input_ids": [1], "attention_mask": [1]}, {"input_ids": [1, 2], "attention_mask": [1, 0]}],
            r"Example 1 has attention_mask zeros",
        ),
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


# ----------------------------------------------------------------------------- every key of every example


@pytest.mark.parametrize("kind", [list, np.array, torch.tensor])
def test_per_token_keys_are_carried_like_input_ids(kind):
    features = [
        {"input_ids": kind([1, 2, 3]), "token_type_ids": kind([0, 0, 1])},
        {"input_ids": kind([4, 5]), "token_type_ids": kind([1, 1])},
    ]
    batch = FlatteningCollator(pad_to_multiple_of=8)(features)
    assert batch["token_type_ids"].tolist() == [[0, 0, 1, 1, 1, 0, 0, 0]]  # 0 in the padding
    assert batch["token_type_ids"].dtype == torch.int64 and batch["token_type_ids"].shape == batch["input_ids"].shape
    assert FlatteningCollator(return_tensors="np")(features)["token_type_ids"].tolist() == [[0, 0, 1, 1, 1]]


def test_boolean_per_token_keys_are_carried_as_int64():
    batch = FlatteningCollator(return_tensors="np")(
        [
            {"input_ids": [1, 2], "special_tokens_mask": np.array([True, False])},
            {"input_ids": [3], "special_tokens_mask": np.array([False])},
        ]
    )
    assert batch["special_tokens_mask"].tolist() == [[1, 0, 0]] and batch["special_tokens_mask"].dtype == np.int64


def test_carried_token_type_ids_reach_gpt2_and_give_its_unpacked_loss():
    """GPT-2 adds a token-type embedding: dropping token_type_ids would change the loss.

    One example, since transformers' GPT-2 does not keep packed examples apart by position_ids.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        initializer_range=0.5,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).eval()
    rng = np.random.default_rng(0)
    example = {"input_ids": rng.integers(1, 64, 9).tolist(), "token_type_ids": rng.integers(0, 64, 9).tolist()}
    ids, types = torch.tensor([example["input_ids"]]), torch.tensor([example["token_type_ids"]])
    with torch.no_grad():
        unpacked = model(input_ids=ids, token_type_ids=types, labels=ids).loss
        packed = model(**FlatteningCollator(pad_to_multiple_of=16)([example])).loss
    torch.testing.assert_close(packed, unpacked, rtol=1e-5, atol=0)


def test_keys_whose_value_is_none_are_skipped():
    batch = FlatteningCollator(return_tensors="np")(
        [{"input_ids": [1, 2], "labels": None, "token_type_ids": None}, {"input_ids": [3], "labels": None}]
    )
    assert set(batch) == {
        "input_ids",
        "labels",
        "position_ids",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "use_cache",
    }
    assert batch["labels"].tolist() == [[-100, 2, -100]]


@pytest.mark.parametrize(
    "key, value, match",
    [
        (
            "idx",
            7,
            r"Example 1: 'idx' is 7 \(int\), not a list with one entry per token \(input_ids has 3 tokens\).*remove_unused_columns=True.*remove_columns\(\['idx'\]\)",
        ),
        (
            "text",
            "abc",
            r"Example 1: 'text' is 'abc' \(str\), not a list with one entry per token \(input_ids has 3 tokens\)",
        ),
        ("score", np.float32(0.5), r"Example 1: 'score' is 0.5 \(float32\), not a list with one entry per token"),
        (
            "score",
            torch.tensor(3),
            r"Example 1: 'score' is tensor\(3\) \(Tensor\), not a list with one entry per token",
        ),
        (
            "spans",
            [1, 2],
            r"Example 1: 'spans' has 2 entries but input_ids has 3 tokens.*fix its length.*remove_columns\(\['spans'\]\)",
        ),
        (
            "spans",
            np.zeros((3, 2), np.int64),
            r"Example 1: 'spans' has shape \(3, 2\), not one entry per token \(input_ids has 3 tokens\)",
        ),
        (
            "seq_idx",
            [0, 0, 0],
            r"Example 1 has 'seq_idx', which FlatteningCollator writes itself.*remove_columns\(\['seq_idx'\]\)",
        ),
        (
            "seq_lengths",
            [2, 1],
            r"Example 1 has 'seq_lengths': the dataset looks pre-packed.*Collate pre-packed rows with PrePackedCollator",
        ),
    ],
    ids=["int", "str", "numpy scalar", "0-d tensor", "other length", "2-D", "written key", "pre-packed row"],
)
def test_keys_that_are_not_per_token_are_refused(key, value, match):
    features = [{"input_ids": [1, 2]}, {"input_ids": [3, 4, 5], key: value}]
    with pytest.raises(ValueError, match=match):
        FlatteningCollator()(features)


def test_a_per_token_key_only_some_examples_have_is_refused():
    features = [
        {"input_ids": [1, 2], "token_type_ids": [0, 1]},
        {"input_ids": [3]},
        {"input_ids": [4], "token_type_ids": None},
    ]
    with pytest.raises(
        ValueError, match=r"Example 1 has no 'token_type_ids' but example 0 has.*Give every example token_type_ids"
    ):
        FlatteningCollator()(features)


@pytest.mark.parametrize("first_has_labels", [True, False])
def test_labels_are_read_from_every_example(first_has_labels):
    with_labels, without = {"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}, {"input_ids": [4, 5]}
    features = [with_labels, without] if first_has_labels else [without, with_labels]
    missing = 1 if first_has_labels else 0
    with pytest.raises(
        ValueError, match=rf"Example {missing} has no 'labels' but example {1 - missing} has.*labels = input_ids"
    ):
        FlatteningCollator()(features)


def test_attention_mask_is_checked_on_every_example():
    collate = FlatteningCollator()
    with pytest.raises(ValueError, match=r"Example 1 has attention_mask zeros"):
        collate([{"input_ids": [1, 2]}, {"input_ids": [3, 4, 0], "attention_mask": [1, 1, 0]}])
    with pytest.raises(ValueError, match=r"Example 2: attention_mask has 1 tokens but input_ids has 2"):
        collate(
            [
                {"input_ids": [1]},
                {"input_ids": [2], "attention_mask": None},
                {"input_ids": [3, 4], "attention_mask": [1]},
            ]
        )
    batch = collate([{"input_ids": [1, 2]}, {"input_ids": [3], "attention_mask": [True]}])
    assert "attention_mask" not in batch and batch["input_ids"].tolist() == [[1, 2, 3]]


@pytest.mark.parametrize("key", ["input_ids", "labels", "token_type_ids"])
@pytest.mark.parametrize(
    "bad, shown",
    [(2.7, r"float 2.7"), ("2", r"str '2'"), (None, r"NoneType None"), (np.float64(2.0), r"float64 2.0")],
    ids=["float", "str", "None", "numpy float"],
)
def test_every_token_value_is_type_checked(key, bad, shown):
    features = [
        {"input_ids": [1, 2], "labels": [1, 2], "token_type_ids": [0, 0]},
        {"input_ids": [3, 4, 5], "labels": [3, 4, 5], "token_type_ids": [0, 1, 1]},
    ]
    features[1][key] = features[1][key][:2] + [bad]
    with pytest.raises(
        TypeError, match=rf"Example 1: {key} must hold integer.*, got {shown} at position 2\. Store them as integers"
    ):
        FlatteningCollator()(features)


def test_a_per_token_key_of_floats_is_refused_with_the_fix():
    features = [{"input_ids": [1, 2], "loss_weights": [1, 1]}, {"input_ids": [3, 4], "loss_weights": [1, 0.5]}]
    with pytest.raises(
        TypeError,
        match=r"Example 1: loss_weights must hold integers, got float 0.5 at position 1\..*"
        r"remove it before collating \(dataset.remove_columns\(\['loss_weights'\]\)\)",
    ):
        FlatteningCollator()(features)


@pytest.mark.parametrize("kind", [np.array, torch.tensor])
def test_float_arrays_anywhere_in_the_batch_are_refused(kind):
    features = [
        {"input_ids": kind([1, 2]), "labels": kind([1, 2])},
        {"input_ids": kind([3, 4]), "labels": kind([3.0, 4.5])},
    ]
    with pytest.raises(
        TypeError, match=r"Example 1: labels must hold integer token ids, got dtype float\w* \(4.5 at position 1\)"
    ):
        FlatteningCollator()(features)
    features[1]["labels"] = kind([True, False])
    with pytest.raises(TypeError, match=r"Example 1: labels must hold integer token ids, got dtype bool"):
        FlatteningCollator()(features)


def test_token_ids_too_large_for_int64_are_refused():
    with pytest.raises(ValueError, match=r"Example 0: input_ids\[1\] = 1180591620717411303424 does not fit in int64"):
        FlatteningCollator()([{"input_ids": [1, 2**70]}])


@pytest.mark.parametrize("kind", [list, np.array, torch.tensor])
def test_a_negative_token_id_is_refused_naming_example_position_and_value(kind):
    features = [{"input_ids": kind([5, 6, 7])}, {"input_ids": kind([8, -100, 9])}]
    with pytest.raises(ValueError, match=r"Example 1: input_ids\[1\] = -100 is negative; .* belongs in labels"):
        FlatteningCollator()(features)
    FlatteningCollator()([{"input_ids": kind([0, 6])}, {"input_ids": kind([8, 9])}])  # 0 is a token id


@pytest.mark.parametrize("collate", [FlatteningCollator(), PrePackedCollator()])
def test_boolean_token_ids_are_refused_by_both_collators(collate):
    features = [{"input_ids": [True, False, True], "seq_lengths": [3]}]
    if isinstance(collate, FlatteningCollator):
        features[0].pop("seq_lengths")
    with pytest.raises(
        TypeError, match=r"input_ids must hold integer token ids, got bool True at position 0\. Booleans"
    ):
        collate(features)


def test_a_batch_with_no_label_to_train_is_warned_about_once_naming_its_size():
    collate = FlatteningCollator(return_tensors="np")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        collate([{"input_ids": [5, 6, 7], "labels": [-100, -100, 7]}, {"input_ids": [8, 9], "labels": [-100, -100]}])
        assert not caught  # one target (7) in the batch: it trains
        for _ in range(3):
            collate([{"input_ids": [5, 6, 7], "labels": [-100, -100, -100]}])
    assert len(caught) == 1  # once per collator, not per step
    assert re.match(
        r"FlatteningCollator: a batch of 1 example \(3 tokens\) has no label to train: every label is -100, so its "
        r"loss is 0\.0",
        str(caught[0].message),
    )
    with pytest.warns(UserWarning, match=r"PrePackedCollator: a batch of 3 examples \(7 tokens\) has no label"):
        PrePackedCollator(mode="pad", max_length=8)(
            [{"input_ids": [1, 2, 3, 4, 5], "labels": [-100] * 5, "seq_lengths": [3, 2]},
             {"input_ids": [6, 7], "labels": [-100, -100], "seq_lengths": [2]}]
        )  # fmt: skip
