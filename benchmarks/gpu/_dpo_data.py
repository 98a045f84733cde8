"""dpo_throughput.py's pairs: text over a word-level tokenizer made in place, one word one token, seeded.

    MIXES[mix] -> pair_lengths(mix, n, seed, smoke) -> (prompt, chosen, rejected) token counts   numpy only
               -> text_pairs(...)                    -> [{"prompt", "chosen", "rejected"}]       TRL's text format
    word_tokenizer(vocab)                            -> <pad>=0, <eos>=1, w0 .. w{vocab-3}: ``vocab`` ids in all

A completion's count includes its ``<eos>``: its text ends with `` <eos>`` (TRL then adds none), and it starts with a
space, so ``prompt + chosen`` splits into the prompt's words and then the completion's (TRL tokenizes the prompt
alone and the prompt with each completion and keeps their common prefix as the prompt). Every setting gets the
same pairs: the draws depend on the mix and the seed only.
"""

from __future__ import annotations

import math

import numpy as np
from _lengths import lengths_of, lognormal_lengths

MAX_LENGTH = 2048  # DPOConfig.max_length: every prompt + completion sequence fits it (the draws are capped)
SMOKE_DIVISOR = 8  # --smoke: every drawn count divided by this (at least SMOKE_MIN), max_length 2048 / 8
SMOKE_MIN = 2
MIX_IDS = {"short_prompt": 1, "long_prompt": 2}
LONG_SIGMA = 0.15

MIXES = {
    "short_prompt": "prompt ~ lognormal(4.7, 0.8) clipped [8, 1024] (mean 150); chosen, rejected each ~ sft = "
    "lognormal(5.3, 0.9) clipped [8, 2048] (mean 296), then capped at 2048 - prompt (mean 294): |P C| + |P R| mean 889",
    "long_prompt": "prompt ~ lognormal(ln 1500 - 0.15^2/2, 0.15) clipped [1000, 1800] (mean 1,487); chosen, rejected "
    "each uniform over the integers [100, 200] (mean 150): |P C| + |P R| mean 3,273",
}


def pair_lengths(mix: str, n: int, seed: int = 0, smoke: bool = False) -> np.ndarray:
    """int64 (n, 3): each pair's prompt, chosen and rejected token counts (a completion's ``<eos>`` counted).

    One generator seeded by (seed, mix) draws the prompts, then the chosen, then the rejected counts (MIXES says how);
    ``smoke`` divides each by 8 (at least 2). Each prompt + completion is at most ``max_length(smoke)``.

    >>> pair_lengths("short_prompt", 3).tolist()
    [[119, 79, 285], [50, 119, 199], [57, 1180, 18]]
    >>> pair_lengths("long_prompt", 2).tolist()
    [[1355, 123, 190], [1407, 160, 114]]
    >>> lengths = pair_lengths("short_prompt", 100_000)
    >>> int((lengths[:, :1] + lengths[:, 1:]).max()) <= MAX_LENGTH
    True
    """
    if mix not in MIX_IDS:
        raise ValueError(f"unknown mix {mix!r}; choose from {', '.join(MIX_IDS)}")
    rng = np.random.default_rng([seed, MIX_IDS[mix]])
    if mix == "short_prompt":
        prompt = lognormal_lengths(n, 4.7, 0.8, 8, 1024, seed=rng)
        chosen = np.minimum(lengths_of("sft", n, rng), MAX_LENGTH - prompt)
        rejected = np.minimum(lengths_of("sft", n, rng), MAX_LENGTH - prompt)
    else:
        prompt = lognormal_lengths(n, math.log(1500) - LONG_SIGMA**2 / 2, LONG_SIGMA, 1000, 1800, seed=rng)
        chosen, rejected = rng.integers(100, 201, n), rng.integers(100, 201, n)
    lengths = np.stack([prompt, chosen, rejected], axis=1).astype(np.int64)
    return np.maximum(SMOKE_MIN, lengths // SMOKE_DIVISOR) if smoke else lengths


def max_length(smoke: bool) -> int:
    return MAX_LENGTH // SMOKE_DIVISOR if smoke else MAX_LENGTH


def mean_pair_tokens(mix: str, seed: int = 0, smoke: bool = False) -> float:
    """The mix's mean |P C| + |P R| (what TRL's padded batch holds unpadded), over 100,000 draws."""
    lengths = pair_lengths(mix, 100_000, seed, smoke)
    return float((2 * lengths[:, 0] + lengths[:, 1] + lengths[:, 2]).mean())


def pairs_per_batch(mix: str, tokens_per_batch: int, seed: int = 0, smoke: bool = False) -> int:
    """Pairs per micro-batch so it holds ``tokens_per_batch`` real tokens on average (at least 1).

    >>> pairs_per_batch("short_prompt", 16384), pairs_per_batch("long_prompt", 16384)
    (18, 5)
    """
    return max(1, round(tokens_per_batch / mean_pair_tokens(mix, seed, smoke)))


def word_tokenizer(vocab: int):
    """A ``PreTrainedTokenizerFast`` of ``vocab`` ids: ``<pad>`` 0, ``<eos>`` 1, then words ``w0`` .. split on spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(vocab - 2)}}
    backend = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def text_pairs(lengths: np.ndarray, vocab: int, seed: int = 0) -> list[dict]:
    """Texts of the given counts, words uniform over the ``vocab - 2`` words; completions end with `` <eos>``."""
    rng = np.random.default_rng([seed, 7])
    ids = rng.integers(0, vocab - 2, int(lengths.sum()))
    words = np.array([f"w{i}" for i in range(vocab - 2)], dtype=object)[ids]
    pairs, at = [], 0
    for prompt, chosen, rejected in lengths.tolist():
        p = words[at : at + prompt]
        c = words[at + prompt : at + prompt + chosen - 1]  # the last token is <eos>
        r = words[at + prompt + chosen : at + prompt + chosen + rejected - 1]
        at += prompt + chosen + rejected
        pairs.append({"prompt": " ".join(p), "chosen": " " + " ".join([*c, "<eos>"]),
                      "rejected": " " + " ".join([*r, "<eos>"])})  # fmt: skip
    return pairs
