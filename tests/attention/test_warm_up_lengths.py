"""FA4's kernel variants follow thresholds on the longest example; the warm-up must meet every variant training can."""

from __future__ import annotations

import pytest

from packing_collators.attention._warm_up import warm_up_lengths


def variant(length: int, thresholds: tuple[float, ...]) -> tuple[bool, ...]:
    return tuple(length <= t for t in thresholds)


@pytest.mark.parametrize(
    "thresholds",
    [
        (64, 128),  # FA4's sm90 backward: queries in one 64-row tile, keys in one 128-row tile (seen on 4 H100s)
        (64,),  # its forward: grouped-query-packed queries in one block (4 query heads a kv head, 256 rows)
        (256 / 3, 128),  # a block over 3 query heads: a threshold inside an octave
        (16, 32, 1000),
    ],
)
@pytest.mark.parametrize("max_length", [100, 2048, 8192])
def test_the_warm_up_meets_every_variant_a_length_up_to_the_longest_can_select(thresholds, max_length):
    trained = {variant(n, thresholds) for n in range(1, max_length + 1)}
    warmed = {variant(n, thresholds) for n in warm_up_lengths(max_length)}
    assert trained == warmed


def test_the_old_warm_up_missed_examples_of_65_to_128_tokens():
    # the warm-up before: 16, 64, 256, ... (x4); an 8B run compiled FA4's backward at a step of 109-125-token examples
    old = [16, 64, 256, 1024, 4096, 8192]
    assert variant(120, (64, 128)) not in {variant(n, (64, 128)) for n in old}
    assert variant(120, (64, 128)) in {variant(n, (64, 128)) for n in warm_up_lengths(8192)}


@pytest.mark.parametrize("thresholds", [(64, 128), (256 / 3, 128), (16, 32, 1000)])
@pytest.mark.parametrize("shortest, max_length", [(100, 2048), (65, 300), (129, 129), (3000, 2048)])
def test_from_the_shortest_example_the_warm_up_meets_every_variant_training_can_and_runs_fewer(
    thresholds, shortest, max_length
):
    # no batch's longest sequence is shorter than its shortest example: the octaves below it can be left out
    trained = {variant(n, thresholds) for n in range(min(shortest, max_length), max_length + 1)}
    assert trained <= {variant(n, thresholds) for n in warm_up_lengths(max_length, shortest)}
    assert len(warm_up_lengths(max_length, shortest)) < len(warm_up_lengths(max_length))


@pytest.mark.parametrize("most_sequences", [None, 300, 256, 10])
def test_the_many_sequence_batches_run_only_where_a_batch_can_hold_that_many(monkeypatch, most_sequences):
    from _tiny_models import tiny_model

    from packing_collators.attention import FA4_MANY, _warm_up

    seen = []  # (sequences, longest) of each warm-up batch
    monkeypatch.setattr(
        _warm_up,
        "_backward_through_layers",
        lambda model, batch, autocast=None, forward_context=None: seen.append((len(batch["cu_seq_lens_q"]) - 1, int(batch["max_length_q"]))),
    )
    _warm_up.warm_up_attention(tiny_model("llama"), max_length=300, shortest=100, most_sequences=most_sequences)
    many = most_sequences is None or most_sequences > FA4_MANY
    assert any(count > FA4_MANY for count, _ in seen) == many
    assert sorted({longest for _, longest in seen}) == warm_up_lengths(300, 100)
