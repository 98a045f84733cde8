"""The chosen column as token counts (``analyze``) or as ``input_ids`` to pack (``pack``), tokenizing if it must.

    tokens, lengths               read from Arrow (lengths_from_dataset): 1M examples in milliseconds
    text                          tokenized with --tokenizer
    messages, prompt/completion   rendered with the tokenizer's chat template, then tokenized

``pack`` tokenizes chat data with :func:`tokenize_chat`, so the packed rows carry ``labels``
that train only the assistant's tokens; ``analyze`` only counts the rendered tokens.
Cost: tokenizing is a batched ``Dataset.map`` over ``num_proc`` processes (up to 8 from
10,000 examples) with a progress bar, kept in memory (nothing is written next to the user's data).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..chat import PROMPT_COMPLETION, conversation_of, render_chats, tokenize_chat
from ..sampler import lengths_from_dataset
from ._column_kinds import ColumnKind, choose_column
from ._hub import hub_load_options
from ._open_data import _looks_like_path

__all__ = ["load_tokenizer", "read_lengths", "token_ids"]

PARALLEL_FROM = 10_000  # examples; below this, one process tokenizes faster than starting more


def load_tokenizer(name: str):
    """``AutoTokenizer.from_pretrained(name)`` (a local folder or a Hub name), or a one-line error naming ``name``.

    >>> load_tokenizer("./no-such-tokenizer")
    Traceback (most recent call last):
    ...
    FileNotFoundError: --tokenizer './no-such-tokenizer' does not exist: no such folder (a Hub tokenizer is named like 'owner/name').
    """
    if not Path(name).expanduser().exists() and _looks_like_path(name):
        raise FileNotFoundError(
            f"--tokenizer {name!r} does not exist: no such folder (a Hub tokenizer is named like 'owner/name')."
        )
    from transformers import AutoTokenizer

    options = hub_load_options(name, what="--tokenizer")  # offline, or no network: said now, not after retries
    try:
        return AutoTokenizer.from_pretrained(name, **options)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"--tokenizer {name!r} could not be loaded ({' '.join(str(error).split())}); pass a folder saved with "
            "save_pretrained, or a Hub name."
        ) from None


def _needs_tokenizer(column: str, kind: str, tokenizer: Any) -> None:
    if tokenizer is None:
        raise ValueError(
            f"Column {column!r} holds {kind}; pass --tokenizer NAME_OR_PATH to count its tokens "
            "(or --column with token ids or lengths)."
        )
    if kind in ("messages", "prompt_completion") and not getattr(tokenizer, "chat_template", None):
        what = "chat messages" if kind == "messages" else "prompts and completions"
        raise ValueError(
            f"Column {column!r} holds {what}, but the tokenizer has no chat template; "
            "pass --tokenizer with a chat model's tokenizer, or --column with text or token ids."
        )


class _Tokenize:
    """A picklable batched map function: text, messages or prompt/completion in, ``input_ids`` (or their lengths) out."""

    def __init__(self, tokenizer: Any, column: str, kind: str, output: str) -> None:
        self.tokenizer, self.column, self.kind, self.output = tokenizer, column, kind, output

    def __call__(self, batch: dict, indices: list[int]) -> dict:
        values = batch[self.column]
        if self.kind == "prompt_completion":  # rendered as tokenize_chat renders it: prompt turns, then completion
            pairs = zip(batch["prompt"], batch["completion"])
            values = [conversation_of(pair, PROMPT_COMPLETION, i)[0] for i, pair in zip(indices, pairs)]
        elif self.kind == "messages":  # checked as tokenize_chat checks them: a message without content is refused
            values = [conversation_of([value], (self.column,), i)[0] for i, value in zip(indices, values)]
        if self.kind in ("messages", "prompt_completion"):  # a template error names its example, as in pack
            texts = render_chats(self.tokenizer, values, indices, generation_prompt=False)
            ids = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        else:
            ids = self.tokenizer(values, return_attention_mask=False)["input_ids"]
        return {self.output: [len(x) for x in ids] if self.output == "length" else ids}


def _default_num_proc(dataset, num_proc: int | None) -> int | None:
    if num_proc is None:
        num_proc = min(os.cpu_count() or 1, 8) if len(dataset) >= PARALLEL_FROM else None
    return num_proc if num_proc and num_proc > 1 else None


def _map_tokens(dataset, column, kind, tokenizer, num_proc, output, remove):
    num_proc = _default_num_proc(dataset, num_proc)
    return dataset.map(
        _Tokenize(tokenizer, column, kind, output),
        batched=True,
        with_indices=True,
        num_proc=num_proc,
        remove_columns=remove,
        keep_in_memory=True,
        desc=f"Tokenizing {column!r}",
    )


def read_lengths(
    dataset: Any, *, column: str | None = None, tokenizer: Any = None, num_proc: int | None = None
) -> tuple[np.ndarray, str, ColumnKind]:
    """``(lengths, column, kind)``: int64 (n,) tokens of each example, and where they came from.

    Token ids and lengths are read from Arrow; text and chat data are tokenized (all
    columns but the lengths are dropped from the map's output, so only they are kept).

    >>> from datasets import Dataset
    >>> lengths, column, kind = read_lengths(Dataset.from_dict({"input_ids": [[1, 2, 3], [4]]}))
    >>> lengths.tolist(), column, kind
    ([3, 1], 'input_ids', 'tokens')
    """
    column, kind = choose_column(dataset, column)
    if kind in ("text", "messages", "prompt_completion"):
        _needs_tokenizer(column, kind, tokenizer)
        dataset = _map_tokens(dataset, column, kind, tokenizer, num_proc, "length", dataset.column_names)
        return lengths_from_dataset(dataset, "length"), column, kind
    return lengths_from_dataset(dataset, column), column, kind


def token_ids(dataset: Any, *, column: str | None = None, tokenizer: Any = None, num_proc: int | None = None):
    """The dataset with its tokens in ``input_ids`` (what ``pack_dataset`` packs), tokenizing text or chat data.

    A text column is replaced by ``input_ids``; chat data (messages, or prompt and completion)
    by ``input_ids`` and ``labels`` from :func:`tokenize_chat`: only the assistant's tokens are
    trained, and conversations with nothing to train are left out (logged). A token-id column
    of another name is renamed to ``input_ids``.

    >>> from datasets import Dataset
    >>> token_ids(Dataset.from_dict({"tokens": [[1, 2, 3]]}), column="tokens")[0]
    {'input_ids': [1, 2, 3]}
    """
    column, kind = choose_column(dataset, column)
    if kind == "lengths":
        raise ValueError(
            f"Column {column!r} holds lengths only; packing needs the token ids: pass --column with a "
            "token-id column, or text/messages with --tokenizer."
        )
    if kind in ("text", "messages", "prompt_completion"):
        _needs_tokenizer(column, kind, tokenizer)
        if "input_ids" in dataset.column_names:
            raise ValueError(
                f"The dataset has both {column!r} and 'input_ids'; pass --column input_ids to pack the token ids it has."
            )
        if kind == "text":
            return _map_tokens(dataset, column, kind, tokenizer, num_proc, "input_ids", [column])
        return tokenize_chat(
            dataset,
            tokenizer,
            column=column if kind == "messages" else None,
            num_proc=_default_num_proc(dataset, num_proc),
            keep_in_memory=True,
        )
    if column != "input_ids":
        if "input_ids" in dataset.column_names:
            raise ValueError(f"The dataset has both {column!r} and 'input_ids'; pack 'input_ids' or remove it first.")
        dataset = dataset.rename_column(column, "input_ids")
    return dataset
