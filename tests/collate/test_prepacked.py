"""PrePackedCollator: flattened rows match FlatteningCollator, padded rows keep examples apart, errors."""

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers.masking_utils import find_packed_sequence_indices

from packing_collators import FlatteningCollator, PrePackedCollator, pack_dataset


def packed_rows(seed, n=80, with_labels=True):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, 1000, int(k)).tolist() for k in rng.integers(1, 50, n)]
    data = {"input_ids": ids}
    if with_labels:
        data["labels"] = [[-100] * (len(x) // 2) + x[len(x) // 2 :] for x in ids]  # completion-only
    return list(pack_dataset(Dataset.from_dict(data), 64, seed=seed)), data


def examples_in(rows, data):
    """The original examples (as FlatteningCollator features), in the order the rows hold them."""
    by_tokens = {}
    for i, x in enumerate(data["input_ids"]):
        by_tokens.setdefault(tuple(x), []).append(i)
    features = []
    for row in rows:
        ends = np.cumsum(row["seq_lengths"])
        for start, end in zip(np.r_[0, ends[:-1]], ends):
            i = by_tokens[tuple(row["input_ids"][start:end])].pop()
            features.append({key: data[key][i] for key in data})
    return features


@pytest.mark.parametrize("with_labels", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_flatten_equals_flattening_collator_on_the_same_examples(seed, with_labels):
    rows, data = packed_rows(seed, with_labels=with_labels)
    batch_rows = rows[:5]
    ours = PrePackedCollator(return_seq_idx=True)(batch_rows)
    theirs = FlatteningCollator(return_seq_idx=True)(examples_in(batch_rows, data))
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
        else:
            assert ours[key] == value and type(ours[key]) is type(value), key
    assert "attention_mask" not in ours


def test_flatten_masks_the_first_label_of_a_row_that_starts_mid_example():
    data = Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5, 6]], "labels": [[1, 2, 3, 4, 5, 6]]})
    rows = list(pack_dataset(data, 4, strategy="wrapped", shuffle_rows=False))
    assert rows[1]["labels"] == [5, 6]  # stored: kept (a causal LM never uses a row's first label)
    batch = PrePackedCollator(return_tensors="np")(rows)
    assert batch["labels"].tolist() == [[-100, 2, 3, 4, -100, 6]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 4, 6]


@pytest.mark.parametrize("seed", range(3))
def test_pad_rows_keep_tokens_and_separate_examples(seed):
    rows, data = packed_rows(seed)
    batch = PrePackedCollator(mode="pad", max_length=64, pad_token_id=7, return_seq_idx=True)(rows[:4])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (4, 64)
    assert all(v.dtype == torch.int64 for k, v in batch.items() if k not in ("seq_idx", "use_cache"))
    assert batch["use_cache"] is False
    assert batch["seq_idx"].dtype == torch.int32
    assert "cu_seq_lens_q" not in batch and "attention_mask" not in batch
    segments = find_packed_sequence_indices(batch["position_ids"])
    for r, row in enumerate(rows[:4]):
        n = len(row["input_ids"])
        assert batch["input_ids"][r, :n].tolist() == row["input_ids"]
        assert batch["input_ids"][r, n:].eq(7).all() and batch["labels"][r, n:].eq(-100).all()
        assert batch["labels"][r, :n].tolist() == row["labels"]
        expected = np.repeat(
            np.arange(len(row["seq_lengths"]) + (n < 64)), row["seq_lengths"] + ([64 - n] if n < 64 else [])
        )
        assert segments[r].tolist() == expected.tolist()  # transformers' masks see each example (and the pad) apart
        assert batch["seq_idx"][r].tolist() == expected.tolist()


def test_pad_literal_and_pad_to_multiple_of():
    rows = [{"input_ids": [1, 2, 3], "seq_lengths": [1, 2]}]
    batch = PrePackedCollator(mode="pad", max_length=5, return_tensors="np")(rows)
    assert batch["position_ids"].tolist() == [[0, 0, 1, 0, 1]]
    assert batch["labels"].tolist() == [[-100, -100, 3, -100, -100]]
    flat = PrePackedCollator(pad_to_multiple_of=4, return_tensors="np")(rows)
    assert flat["cu_seq_lens_q"].tolist() == [0, 1, 3, 4] and flat["input_ids"].shape == (1, 4)


def test_reloaded_dataset_collates(tmp_path):
    rows, data = packed_rows(0)
    dataset = pack_dataset(Dataset.from_dict(data), 64, seed=0)
    dataset.save_to_disk(str(tmp_path / "d"))
    from datasets import load_from_disk

    reloaded = list(load_from_disk(str(tmp_path / "d")))
    collate = PrePackedCollator()
    assert all(
        torch.equal(collate(reloaded[:3])[k], collate(rows[:3])[k]) for k in ("input_ids", "labels", "position_ids")
    )


@pytest.mark.parametrize(
    "rows, kwargs, match",
    [
        ([{"input_ids": [1, 2, 3], "seq_lengths": [2]}], {}, r"Row 0: seq_lengths sum to 2 but input_ids has 3 tokens"),
        (
            [{"input_ids": [1], "seq_lengths": [1]}, {"input_ids": [1, 2], "seq_lengths": [1, 0, 1]}],
            {},
            r"Row 1: seq_lengths has a length of 0",
        ),
        ([{"input_ids": [1, 2]}], {}, r"Example 0 has no 'seq_lengths'"),
        (
            [{"input_ids": [1, 2], "seq_lengths": [2], "labels": [1]}],
            {},
            r"Row 0: labels has 1 tokens but input_ids has 2",
        ),
        (
            [{"input_ids": [1, 2, 3], "seq_lengths": [3]}],
            {"mode": "pad", "max_length": 2},
            r"Row 0 has 3 tokens, more than max_length=2",
        ),
        ([{"input_ids": [1, 2], "seq_lengths": [2], "attention_mask": [1, 0]}], {}, r"attention_mask zeros"),
        ([], {}, r"empty batch"),
    ],
)
def test_bad_rows_give_clear_errors(rows, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrePackedCollator(**kwargs)(rows)


def test_bad_options():
    with pytest.raises(ValueError, match=r"mode='pad' needs max_length"):
        PrePackedCollator(mode="pad")
    with pytest.raises(ValueError, match=r"mode='rows' is not supported"):
        PrePackedCollator(mode="rows")
    with pytest.raises(ValueError, match=r"pad_to_multiple_of is for mode='flatten'"):
        PrePackedCollator(mode="pad", max_length=8, pad_to_multiple_of=8)


def test_options_are_one_frozen_object_checked_at_construction():
    import dataclasses

    collator = PrePackedCollator(mode="pad", max_length=8, pad_token_id=3, return_tensors="np")
    assert (collator.mode, collator.max_length, collator.options.mode, collator.options.pad_token_id) == (
        "pad",
        8,
        "pad",
        3,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        collator.options.max_length = 4
    assert repr(collator).startswith(
        "PrePackedCollator(mode='pad', max_length=8, pad_to_multiple_of=None, pad_token_id=3"
    )
    with pytest.raises(ValueError, match=r"max_length must be a positive integer"):
        PrePackedCollator(mode="pad", max_length=0)


# ----------------------------------------------------------------------------- every key of every row


def rows_with_token_type_ids():
    data = Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "token_type_ids": [[0, 0, 1], [1, 1], [0, 1, 1, 1]]}
    )
    return list(pack_dataset(data, 5, strategy="next_fit", shuffle_rows=False)), data


def test_flatten_carries_per_token_keys_like_flattening_collator():
    rows, data = rows_with_token_type_ids()
    assert [row["seq_lengths"] for row in rows] == [[3, 2], [4]]
    ours = PrePackedCollator(pad_to_multiple_of=4)(rows)
    assert ours["token_type_ids"].tolist() == [[0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0]]  # 0 in the padding
    assert ours["token_type_ids"].dtype == torch.int64
    theirs = FlatteningCollator(pad_to_multiple_of=4)(list(data))
    assert torch.equal(ours["token_type_ids"], theirs["token_type_ids"])


def test_pad_carries_per_token_keys_padded_per_row():
    rows, _ = rows_with_token_type_ids()
    batch = PrePackedCollator(mode="pad", max_length=6, return_tensors="np")(rows)
    assert batch["token_type_ids"].tolist() == [[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]]
    assert batch["token_type_ids"].dtype == np.int64 and batch["token_type_ids"].shape == batch["input_ids"].shape


def test_kept_per_example_columns_are_refused_with_the_fix():
    data = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "source": ["web", "math", "web"]})
    rows = list(pack_dataset(data, 5, strategy="next_fit", shuffle_rows=False, keep_columns=["source"]))
    with pytest.raises(
        ValueError, match=r"Row 0: 'source' has 2 entries but input_ids has 5 tokens.*remove_columns\(\['source'\]\)"
    ):
        PrePackedCollator()(rows)


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"idx": 3}, r"Row 1: 'idx' is 3 \(int\), not a list with one entry per token \(input_ids has 2 tokens\)"),
        ({"cu_seq_lens_q": [0, 2]}, r"Row 1 has 'cu_seq_lens_q', which PrePackedCollator writes itself"),
    ],
    ids=["scalar", "written key"],
)
def test_keys_that_are_not_per_token_are_refused(extra, match):
    rows = [{"input_ids": [1], "seq_lengths": [1]}, {"input_ids": [2, 3], "seq_lengths": [2], **extra}]
    with pytest.raises(ValueError, match=match):
        PrePackedCollator()(rows)


def test_labels_are_read_from_every_row():
    rows = [{"input_ids": [1, 2], "seq_lengths": [2]}, {"input_ids": [3, 4], "seq_lengths": [2], "labels": [-100, 4]}]
    with pytest.raises(ValueError, match=r"Row 0 has no 'labels' but row 1 has.*labels = input_ids"):
        PrePackedCollator()(rows)


@pytest.mark.parametrize("mode", ["flatten", "pad"])
def test_attention_mask_is_checked_on_every_row(mode):
    rows = [
        {"input_ids": [1, 2], "seq_lengths": [2]},
        {"input_ids": [3, 0], "seq_lengths": [2], "attention_mask": [1, 0]},
    ]
    with pytest.raises(ValueError, match=r"Row 1 has attention_mask zeros"):
        PrePackedCollator(mode=mode, max_length=4)(rows)


def test_none_values_are_skipped():
    rows = [{"input_ids": [1, 2], "seq_lengths": [2], "labels": None, "token_type_ids": None}]
    batch = PrePackedCollator(return_tensors="np")(rows)
    assert "token_type_ids" not in batch and batch["labels"].tolist() == [[-100, 2]]


@pytest.mark.parametrize(
    "key, bad, match",
    [
        ("input_ids", 2.7, r"Row 1: input_ids must hold integer token ids, got float 2.7 at position 1\."),
        ("labels", "4", r"Row 1: labels must hold integer token ids, got str '4' at position 1\."),
        ("token_type_ids", None, r"Row 1: token_type_ids must hold integers, got NoneType None at position 1\."),
        ("seq_lengths", 1.0, r"Row 1: seq_lengths must hold integers, got float 1.0 at position 1\."),
    ],
    ids=["float input_ids", "str labels", "None token_type_ids", "float seq_lengths"],
)
def test_every_value_is_type_checked(key, bad, match):
    rows = [
        {"input_ids": [1, 2], "seq_lengths": [2], "labels": [1, 2], "token_type_ids": [0, 0]},
        {"input_ids": [3, 4], "seq_lengths": [1, 1], "labels": [3, 4], "token_type_ids": [0, 1]},
    ]
    rows[1][key] = rows[1][key][:1] + [bad]
    with pytest.raises(TypeError, match=match):
        PrePackedCollator()(rows)


def test_a_negative_token_id_in_a_row_is_refused():
    rows = [{"input_ids": [1, 2, 3], "seq_lengths": [3]}, {"input_ids": [4, 5, -1, 6], "seq_lengths": [2, 2]}]
    for mode in ("flatten", "pad"):
        with pytest.raises(ValueError, match=r"Row 1: input_ids\[2\] = -1 is negative"):
            PrePackedCollator(mode=mode, max_length=8)(rows)


def kept_rows():
    """Rows of pack_dataset with three per-example columns kept (a string, a float, an int)."""
    data = Dataset.from_dict(
        {
            "input_ids": [[5, 6, 7], [8, 9], [1, 2, 3, 4]],
            "source": ["web", "math", "code"],
            "weight": [0.5, 1.0, 2.0],
            "id": [7, 8, 9],
        }
    )
    return list(pack_dataset(data, 5, keep_columns=["source", "weight", "id"], shuffle_rows=False))


@pytest.mark.parametrize("mode", ["flatten", "pad"])
def test_kept_columns_come_back_one_value_per_example_in_segment_order(mode):
    rows = kept_rows()
    batch = PrePackedCollator(mode=mode, max_length=5, keep_columns=["source", "weight", "id"])(rows)
    order = [value for row in rows for value in row["source"]]
    assert sorted(order) == ["code", "math", "web"] and batch["source"] == order
    ids = {"web": 7, "math": 8, "code": 9}
    assert batch["id"].dtype == torch.int64 and batch["id"].tolist() == [ids[s] for s in order]
    weights = {"web": 0.5, "math": 1.0, "code": 2.0}
    assert batch["weight"].is_floating_point() and batch["weight"].tolist() == [weights[s] for s in order]
    segments = [n for row in rows for n in row["seq_lengths"]]
    if mode == "flatten":
        assert np.diff(batch["cu_seq_lens_q"].numpy()).tolist() == segments  # value i belongs to segment i


def test_kept_columns_are_checked_and_named_in_the_refusal():
    rows = kept_rows()
    with pytest.raises(ValueError, match=r"Row 0: 'source' has .*PrePackedCollator\(keep_columns=\['source'\]\)"):
        PrePackedCollator()(
            [{k: v for k, v in row.items() if k in ("input_ids", "seq_lengths", "source")} for row in rows]
        )
    rows[1]["source"] = rows[1]["source"] + ["extra"]
    with pytest.raises(ValueError, match=r"Row 1: 'source' has \d values but the row holds \d examples"):
        PrePackedCollator(keep_columns="source")(
            [{k: row[k] for k in ("input_ids", "seq_lengths", "source")} for row in rows]
        )
    with pytest.raises(ValueError, match=r"keep_columns cannot name 'labels'"):
        PrePackedCollator(keep_columns=["labels"])
    bare = [{"input_ids": row["input_ids"], "seq_lengths": row["seq_lengths"]} for row in rows]
    assert "source" not in PrePackedCollator(keep_columns=["source"])(bare)  # rows without it (the probe's)
