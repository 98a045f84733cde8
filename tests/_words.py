"""A word-level tokenizer made in place (nothing downloaded): the DPO and RL tests' text."""

from __future__ import annotations

WORDS = ["<pad>", "<eos>"] + [f"w{i}" for i in range(60)]


def word_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :data:`WORDS` (whitespace split), pad ``<pad>``, eos ``<eos>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
