"""pack_sequences and concatenate_and_pack: token lists to padded packed rows."""

import numpy as np
import pytest
import torch

from packing_collators import concatenate_and_pack, pack_sequences


def random_sequences(rng, n, max_len, vocab=1000):
    return [rng.integers(1, vocab, size=int(rng.integers(0, max_len + 1))).tolist() for _ in range(n)]


def test_seed_doc_example_exactly():
    # the fast_axolotl Token Packing docs, which these functions mirror: greedy, in order, by default
    rows = pack_sequences(
        [torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7, 8, 9]), torch.tensor([10, 11, 12])],
        max_length=8,
        pad_token_id=0,
    )
    assert rows.dtype == torch.long
    assert rows.tolist() == [[1, 2, 3, 4, 5, 0, 0, 0], [6, 7, 8, 9, 10, 11, 12, 0]]
    rows, bounds = pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12]], 8, 0, return_boundaries=True)
    assert bounds == [[(0, 3), (3, 5)], [(0, 4), (4, 7)]]
    inputs, _, _ = concatenate_and_pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], [[1, 2, 3], [4, 5], [6, 7, 8, 9]],
                                        [[1] * 3, [1] * 2, [1] * 4], max_length=6, pad_token_id=0)  # fmt: skip
    assert inputs.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12]], 8, 0, strategy="bfd").tolist() == [
        [1, 2, 3, 6, 7, 8, 9, 0],
        [4, 5, 10, 11, 12, 0, 0, 0],
    ]


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "next_fit"])
@pytest.mark.parametrize("seed", range(8))
def test_rows_hold_every_sequence_once_at_its_boundaries(strategy, seed):
    rng = np.random.default_rng(seed)
    sequences = [s for s in random_sequences(rng, 60, 20) if s]
    rows, bounds = pack_sequences(sequences, 24, pad_token_id=-1, return_boundaries=True, strategy=strategy)
    assert rows.shape[1] == 24
    found = []
    for row, row_bounds in zip(rows.tolist(), bounds):
        end = 0
        for start, stop in row_bounds:
            assert start == end  # sequences sit back to back
            found.append(tuple(row[start:stop]))
            end = stop
        assert all(t == -1 for t in row[end:])
    assert sorted(found) == sorted(tuple(s) for s in sequences)


def test_input_kinds_give_the_same_rows():
    seqs = [[1, 2, 3], [4, 5], [6]]
    a = pack_sequences(seqs, 4, 0)
    b = pack_sequences([np.array(s) for s in seqs], 4, 0)
    c = pack_sequences([torch.tensor(s) for s in seqs], 4, 0)
    assert torch.equal(a, b) and torch.equal(a, c)


def test_empty_and_overflow_are_reported_by_count():
    with pytest.warns(UserWarning, match=r"truncated 1 sequence\(s\) to 4 tokens \(2 tokens cut\).*skipped 1 empty"):
        rows = pack_sequences([[1, 2, 3, 4, 5, 6], [], [7]], 4, 0, overflow="truncate", strategy="next_fit")
    assert rows.tolist() == [[1, 2, 3, 4], [7, 0, 0, 0]]
    with pytest.warns(UserWarning, match=r"dropped 1 sequence\(s\) longer than 4 \(6 tokens\)"):
        rows = pack_sequences([[1, 2, 3, 4, 5, 6], [7]], 4, 0, overflow="drop")
    assert rows.tolist() == [[7, 0, 0, 0]]


@pytest.mark.parametrize(
    "pack",
    [lambda: pack_sequences([[1], []], 4, 0), lambda: concatenate_and_pack([[1], []], [[1], []], [[1], []], 4, 0)],
)
def test_loss_warnings_point_at_the_callers_line(pack):
    with pytest.warns(UserWarning, match="skipped 1 empty") as record:
        pack()
    assert record[0].filename == __file__


def test_too_long_is_an_error_naming_the_sequence():
    with pytest.raises(ValueError, match=r"Example 1 has 5 tokens, more than capacity=4"):
        pack_sequences([[1], [1, 2, 3, 4, 5]], 4, 0)


def test_non_integer_tokens_are_refused():
    with pytest.raises(TypeError, match=r"Example 1: sequences must hold integer token ids, got float 1.5"):
        pack_sequences([[1], [1.5, 2]], 4, 0)


def test_two_dimensional_tensor_is_refused():
    with pytest.raises(ValueError, match=r"Example 0: sequences must be one-dimensional, got shape \(1, 2\)"):
        pack_sequences([torch.tensor([[1, 2]])], 4, 0)


@pytest.mark.parametrize("seed", range(6))
def test_concatenate_and_pack_keeps_labels_with_their_tokens(seed):
    rng = np.random.default_rng(seed)
    inputs = [s for s in random_sequences(rng, 40, 12) if s]
    labels = [[t + 10_000 for t in s] for s in inputs]  # label = token + 10000, so alignment is checkable
    masks = [[1] * len(s) for s in inputs]
    packed_inputs, packed_labels, packed_masks = concatenate_and_pack(
        inputs, labels, masks, 16, pad_token_id=0, strategy="bfd"
    )
    real = packed_masks.bool()
    assert packed_inputs[real].numel() == sum(map(len, inputs))
    aligned = packed_labels[real] == packed_inputs[real] + 10_000
    # Only each sequence's first label is masked; everything else is aligned with its token.
    assert int((packed_labels[real] == -100).sum()) == len(inputs)
    assert bool(aligned[packed_labels[real] != -100].all())
    assert bool((packed_labels[~real] == -100).all()) and bool((packed_inputs[~real] == 0).all())


@pytest.mark.parametrize(
    "labels, masks, match",
    [
        ([[1, 2]], [[1]], r"Example 0: attention_mask has 1 tokens but input_ids has 2"),
        ([[1]], [[1, 1]], r"Example 0: labels has 1 tokens but input_ids has 2"),
        ([], [[1, 1]], r"Got 1 input sequences but 0 labels"),
    ],
)
def test_concatenate_and_pack_mismatches(labels, masks, match):
    with pytest.raises(ValueError, match=match):
        concatenate_and_pack([[5, 6]], labels, masks, 4, 0)


def test_concatenate_and_pack_refuses_mismatches_before_warning_about_losses():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a loss warning before the error would fail here
        with pytest.raises(ValueError, match=r"Example 1: labels has 1 tokens but input_ids has 2"):
            concatenate_and_pack([[], [5, 6]], [[], [5]], [[], [1, 1]], 4, 0)


# --- return_position_ids: rows a model can train on exactly ------------------------------------


def test_plain_outputs_are_unchanged_by_the_new_option():
    sequences = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    rows = pack_sequences(sequences, 6, 0, strategy="next_fit")
    assert isinstance(rows, torch.Tensor) and rows.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 0]]
    rows, bounds = pack_sequences(sequences, 6, 0, return_boundaries=True, strategy="next_fit")
    assert bounds == [[(0, 3), (3, 5)], [(0, 4), (4, 5)]]
    packed = concatenate_and_pack(sequences, sequences, [[1] * len(s) for s in sequences], 6, 0, strategy="next_fit")
    assert len(packed) == 3
    assert [t.tolist() for t in packed] == [
        [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 0]],
        [[-100, 2, 3, -100, 5, -100], [-100, 7, 8, 9, -100, -100]],
        [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]],
    ]


def test_position_ids_restart_per_sequence_and_for_the_padding():
    sequences = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    rows, positions = pack_sequences(sequences, 6, 0, return_position_ids=True, strategy="next_fit")
    assert rows.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 0]]
    assert positions.dtype == torch.int64 and positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
    rows, bounds, positions = pack_sequences(
        sequences, 6, 0, return_boundaries=True, return_position_ids=True, strategy="next_fit"
    )
    assert bounds == [[(0, 3), (3, 5)], [(0, 4), (4, 5)]] and positions.shape == (2, 6)
    *packed, positions = concatenate_and_pack(
        sequences, sequences, [[1] * len(s) for s in sequences], 6, 0, return_position_ids=True, strategy="next_fit"
    )
    assert len(packed) == 3 and positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]


@pytest.mark.parametrize("strategy", ["bfd", "next_fit"])
@pytest.mark.parametrize("seed", range(4))
def test_position_ids_follow_the_boundaries(strategy, seed):
    rng = np.random.default_rng(seed)
    sequences = random_sequences(rng, 40, 12)
    with pytest.warns(UserWarning, match="empty"):
        rows, bounds, positions = pack_sequences(
            sequences, 16, 0, return_boundaries=True, return_position_ids=True, strategy=strategy
        )
    for row, spans in enumerate(bounds):
        expected = np.concatenate([np.arange(e - s) for s, e in spans] + [np.arange(16 - spans[-1][1])])
        assert positions[row].tolist() == expected.tolist()


def test_truncated_sequences_get_positions_of_their_kept_tokens():
    with pytest.warns(UserWarning, match="truncated 1"):
        rows, positions = pack_sequences([[1, 2, 3, 4, 5, 6], [7]], 4, 0, return_position_ids=True, overflow="truncate")
    assert rows.tolist() == [[1, 2, 3, 4], [7, 0, 0, 0]] and positions.tolist() == [[0, 1, 2, 3], [0, 0, 1, 2]]


def test_no_sequences_give_no_rows_and_no_positions():
    rows, positions = pack_sequences([], 4, 0, return_position_ids=True)
    assert rows.shape == positions.shape == (0, 4)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_rows_with_position_ids_give_the_padded_loss(attn):
    from _tiny_models import padded_batch, random_examples, tiny_model

    model = tiny_model("llama", attn=attn)
    examples = random_examples([7, 3, 9, 5, 2, 6], seed=1, completion_only=True)
    ids = [e["input_ids"] for e in examples]
    labels = [e["labels"] for e in examples]
    inputs, packed_labels, masks, positions = concatenate_and_pack(
        ids, labels, [[1] * len(i) for i in ids], 16, 0, return_position_ids=True
    )
    assert inputs.shape[0] < len(examples)  # several examples share a row
    with torch.no_grad():
        padded = model(**padded_batch(examples)).loss
        exact = model(input_ids=inputs, labels=packed_labels, position_ids=positions).loss
        bare = model(input_ids=inputs, labels=packed_labels, attention_mask=masks).loss
    torch.testing.assert_close(exact, padded, rtol=0, atol=1e-6)
    assert abs(bare.item() - padded.item()) > 1e-3  # the bare rows let examples attend to each other
