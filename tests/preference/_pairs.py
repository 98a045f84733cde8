"""Preference pairs and a word-level tokenizer made in place (nothing downloaded), for the DPO tests."""

from __future__ import annotations

import numpy as np

from _words import WORDS, word_tokenizer  # noqa: E402, F401 (the tokenizer the DPO and RL tests share)


def text_pairs(count: int = 12, seed: int = 0, prompt=(3, 12), completion=(1, 9)) -> list[dict]:
    """Random prompt / chosen / rejected texts of the given word-count ranges."""
    rng = np.random.default_rng(seed)

    def words(low, high):
        return " ".join(f"w{i}" for i in rng.integers(0, 60, int(rng.integers(low, high))))

    return [{"prompt": words(*prompt), "chosen": words(*completion), "rejected": words(*completion)} for _ in range(count)]
