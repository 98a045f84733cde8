"""FA4's kernel variants follow thresholds on the longest example; the warm-up must meet every variant training can."""

from __future__ import annotations

import pytest

from packing_collators.attention._choice import warm_up_lengths


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
