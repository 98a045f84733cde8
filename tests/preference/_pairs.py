"""Preference pairs and a word-level tokenizer made in place (nothing downloaded), for the DPO tests."""

from __future__ import annotations

import numpy as np

WORDS = ["<pad>", "<eos>"] + [f"w{i}" for i in range(60)]


def word_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :data:`WORDS` (whitespace split), pad ``<pad>``, eos ``<eos>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def text_pairs(count: int = 12, seed: int = 0, prompt=(3, 12), completion=(1, 9)) -> list[dict]:
    """Random prompt / chosen / rejected texts of the given word-count ranges."""
    rng = np.random.default_rng(seed)

    def words(low, high):
        return " ".join(f"w{i}" for i in rng.integers(0, 60, int(rng.integers(low, high))))

    return [{"prompt": words(*prompt), "chosen": words(*completion), "rejected": words(*completion)} for _ in range(count)]
