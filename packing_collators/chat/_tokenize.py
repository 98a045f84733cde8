"""Chat and instruction data tokenized for SFT: ``input_ids`` and ``labels`` that train only the assistant.

A ``messages`` row (or ``prompt``/``completion``) rendered with the tokenizer's chat template::

    text       <|im_start|>user hi<|im_end|> <|im_start|>assistant  hello <|im_end|>
    input_ids  0            2    4  1        0            3          5     1
    labels     -100         -100 -100 -100   -100         -100       5     1

``labels`` equal ``input_ids`` on assistant tokens (the answer and its end-of-turn token) and are
``label_pad_id`` on every system, user, tool and template token; they are not shifted (the model
shifts them). Which tokens are the assistant's: ``_assistant_spans``. Examples over ``max_length``
follow ``overflow`` as in :func:`pack_dataset` (``"error"``, ``"truncate"``, ``"drop"``), and examples
left with no trained token are dropped; both are counted in :class:`ChatStats` and logged.

Cost: a batched ``datasets.map`` (``num_proc`` processes): per 1,000 conversations, their jinja
renders and one call to the Rust tokenizer; against ``apply_chat_template`` without labels:
docs/chat.md ("Parallel and batched").
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .._splits import per_split
from .._validation import check_not_too_long, validate_choice
from ..engine import Overflow
from ..offline import MAX_LENGTH_FIX
from ._assistant_spans import AssistantSpans, assistant_labels, with_full_offsets
from ._conversations import chat_columns, conversation_of
from ._options import ChatOptions
from ._stats import ChatStats

__all__ = ["tokenize_chat", "tokenize_chat_example"]

logger = logging.getLogger(__name__)
_LENGTH, _TRAINED = "__chat_tokens__", "__chat_trained_tokens__"  # per example, read back and removed


class _ChatBatch:
    """The picklable batched map function: chat columns (and indices) in, ids, labels and two counts out."""

    def __init__(self, tokenizer, columns, options: ChatOptions) -> None:
        self.tokenizer = with_full_offsets(tokenizer)  # copied once here, not per batch
        self.columns, self.options = tuple(columns), options
        from .._version import __version__

        self.library_version = __version__  # hashed into datasets' cache key: a new release labels afresh

    def __call__(self, *args) -> dict:
        *values, indices = args
        conversations, firsts = zip(*(conversation_of(row, self.columns, i) for row, i in zip(zip(*values), indices)))
        ids, labels = assistant_labels(
            self.tokenizer,
            conversations,
            firsts,
            indices=indices,
            assistant_spans=self.options.assistant_spans,
            label_pad_id=self.options.label_pad_id,
        )
        lengths = [len(x) for x in ids]
        if self.options.truncates:
            ids = [x[: self.options.max_length] for x in ids]
            labels = [x[: self.options.max_length] for x in labels]
        trained = [len(x) - x.count(self.options.label_pad_id) for x in labels]
        return {"input_ids": ids, "labels": labels, _LENGTH: lengths, _TRAINED: trained}


def tokenize_chat_example(
    example: dict,
    tokenizer: Any,
    *,
    assistant_spans: AssistantSpans = "auto",
    label_pad_id: int = -100,
    index: int = 0,
) -> dict:
    """One row (``messages``, or ``prompt`` and ``completion``) as ``{"input_ids", "labels"}``, without ``datasets``.

    The same tokenization as :func:`tokenize_chat` (no ``max_length``); ``index`` is the number
    errors give the example.

    >>> from packing_collators.chat._toy_tokenizer import toy_chat_tokenizer
    >>> tokenizer = toy_chat_tokenizer()  # word-level: <|im_start|> 0, <|im_end|> 1, user 2, assistant 3, hi 4, hello 5
    >>> tokenize_chat_example({"prompt": "hi", "completion": "hello"}, tokenizer)
    {'input_ids': [0, 2, 4, 1, 0, 3, 5, 1], 'labels': [-100, -100, -100, -100, -100, -100, 5, 1]}
    """
    validate_choice("assistant_spans", assistant_spans, AssistantSpans)
    columns = chat_columns(list(example))
    conversation, first = conversation_of([example[c] for c in columns], columns, index)
    ids, labels = assistant_labels(
        tokenizer, [conversation], [first], indices=[index], assistant_spans=assistant_spans, label_pad_id=label_pad_id
    )
    return {"input_ids": ids[0], "labels": labels[0]}


def _counts(tokenized, name: str) -> np.ndarray:
    return tokenized.data.column(name).to_numpy().astype(np.int64, copy=False)


def _empty_split(dataset, columns, options: ChatOptions, split_name: str):
    """No examples: an empty dataset with ``input_ids`` and ``labels`` (``map`` writes no columns for 0 rows), warned."""
    import datasets

    ids, labels = datasets.Sequence(datasets.Value("int32")), datasets.Sequence(datasets.Value("int64"))  # as map does
    features = datasets.Features({**dataset.remove_columns(list(columns)).features, "input_ids": ids, "labels": labels})
    empty = datasets.Dataset.from_dict({name: [] for name in features}, features=features)
    stats = ChatStats(examples=0, kept_examples=0, tokens=0, trained_tokens=0, max_length=options.max_length)
    logger.warning(
        "tokenize_chat%s: the dataset has no examples, so the result is empty (%s).",
        f"[{split_name}]" if split_name else "",
        stats.summary(),
    )
    return empty, stats


def _tokenize_split(dataset, tokenizer, options: ChatOptions, split_name: str = ""):
    columns = chat_columns(dataset.column_names, options.column)
    clash = [name for name in ("input_ids", "labels") if name in dataset.column_names and name not in columns]
    if clash:
        raise ValueError(
            f"The dataset already has {clash}, which tokenize_chat writes; remove them first "
            f"(dataset.remove_columns({clash}))."
        )
    if len(dataset) == 0:
        return _empty_split(dataset, columns, options, split_name)
    tokenized = dataset.map(
        _ChatBatch(tokenizer, columns, options),
        batched=True,
        with_indices=True,
        input_columns=list(columns),
        remove_columns=list(columns),
        num_proc=options.map_processes,
        keep_in_memory=options.keep_in_memory,
        desc=f"Tokenizing chat{f' [{split_name}]' if split_name else ''}",
    )
    keep, stats = _kept(_counts(tokenized, _LENGTH), _counts(tokenized, _TRAINED), options)
    if not keep.all():
        tokenized = tokenized.select(np.flatnonzero(keep))
    tokenized = tokenized.remove_columns([_LENGTH, _TRAINED])
    logger.log(
        logging.WARNING if stats.lost else logging.INFO,
        "tokenize_chat%s: %s",
        f"[{split_name}]" if split_name else "",
        stats.summary(),
    )
    return tokenized, stats


def _kept(lengths: np.ndarray, trained: np.ndarray, options: ChatOptions) -> tuple[np.ndarray, ChatStats]:
    """Which examples stay (``overflow``, ``drop_untrained``) and the counts of what was kept and lost."""
    max_length, overflow = options.max_length, options.overflow
    over = lengths > max_length if max_length is not None else np.zeros(len(lengths), bool)
    if overflow == "error" and max_length is not None:
        check_not_too_long(lengths, max_length, limit_name="max_length", fix=MAX_LENGTH_FIX)
    keep = ~over if overflow == "drop" else np.ones(len(lengths), bool)
    untrained = keep & (trained == 0) if options.drop_untrained else np.zeros(len(lengths), bool)
    keep &= ~untrained
    truncated = over if overflow == "truncate" else np.zeros(len(lengths), bool)
    kept_lengths = np.minimum(lengths, max_length) if max_length is not None else lengths
    return keep, ChatStats(
        examples=len(lengths),
        kept_examples=int(keep.sum()),
        tokens=int(kept_lengths[keep].sum()),
        trained_tokens=int(trained[keep].sum()),
        max_length=max_length,
        truncated_examples=int((truncated & keep).sum()),
        truncated_tokens=int((lengths - max_length)[truncated & keep].sum()) if max_length is not None else 0,
        dropped_examples=int((over & ~keep).sum()) if overflow == "drop" else 0,
        dropped_tokens=int(lengths[over].sum()) if overflow == "drop" else 0,
        untrained_examples=int(untrained.sum()),
    )


def tokenize_chat(
    dataset: Any,
    tokenizer: Any,
    *,
    column: str | None = None,
    max_length: int | None = None,
    overflow: Overflow = "error",
    assistant_spans: AssistantSpans = "auto",
    label_pad_id: int = -100,
    drop_untrained: bool = True,
    num_proc: int | None = None,
    keep_in_memory: bool = False,
    return_stats: bool = False,
):
    """Tokenize chat or instruction data with the tokenizer's chat template, training only the assistant.

    Args:
        dataset: a ``datasets.Dataset`` (or ``DatasetDict``, split by split) with a ``messages``
            column (lists of ``{"role", "content"}`` dicts), or ``prompt`` and ``completion``
            columns (strings, or lists of messages as TRL takes them).
        tokenizer: a tokenizer with a chat template. A template with ``{% generation %}`` markers
            trains what they cover; one without is split by rendering prefixes, and a template that
            cannot be split that way is a ValueError naming the tokenizer, the example and the fix.
        column: the messages column, if not ``messages`` (default: ``messages``, else prompt/completion).
        max_length: tokens per example; None (default) for no limit.
        overflow: an example longer than ``max_length``: ``"error"`` (default: a ValueError naming
            it, its length and the limit), ``"truncate"`` (its first ``max_length`` tokens) or
            ``"drop"``. To keep every token of long conversations in pieces, leave ``max_length``
            None here and pack with ``pack_dataset(..., overflow="split")``.
        assistant_spans: ``"auto"`` (default), ``"generation"`` or ``"prefixes"``: how the assistant's
            tokens are found (``packing_collators/chat/_assistant_spans.py``).
        label_pad_id: the label of every token not trained.
        drop_untrained: leave out examples with no trained token (no assistant turn to train, or
            one truncated away); they add no loss, only compute.
        num_proc: processes for ``datasets.map`` (None: one).
        keep_in_memory: keep the result in memory instead of ``datasets``' cache files.
        return_stats: also return a :class:`ChatStats` (a dict of them for a ``DatasetDict``).

    Returns:
        The dataset with ``input_ids`` and ``labels`` (lists of int, the same length per example)
        in place of the chat columns; other columns are kept. ``prompt``/``completion`` data trains
        the completion's assistant turns only; ``messages`` data trains every assistant turn.

    >>> from datasets import Dataset
    >>> from packing_collators.chat._toy_tokenizer import toy_chat_tokenizer
    >>> tokenizer = toy_chat_tokenizer()  # word-level: <|im_start|> 0, <|im_end|> 1, user 2, assistant 3, hi 4, hello 5
    >>> chats = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    ...          [{"role": "user", "content": "hi hi hi"}, {"role": "assistant", "content": "hello hello"}]]
    >>> data = Dataset.from_dict({"messages": chats, "source": ["a", "b"]})
    >>> tokenized, stats = tokenize_chat(data, tokenizer, max_length=9, overflow="drop", return_stats=True)
    >>> tokenized[0]
    {'source': 'a', 'input_ids': [0, 2, 4, 1, 0, 3, 5, 1], 'labels': [-100, -100, -100, -100, -100, -100, 5, 1]}
    >>> stats.summary()
    '2 examples -> 1 kept, 8 tokens (2 trained, 25.00%); max_length 9: truncated 0 (0 tokens cut), dropped 1 (11 tokens); 0 with no trained token dropped'
    >>> tokenize_chat(data, tokenizer, max_length=9)
    Traceback (most recent call last):
    ...
    ValueError: Example 1 has 11 tokens, more than max_length=9 (1 example(s) too long, the longest 11 tokens). Pass overflow='truncate' or overflow='drop', or raise max_length.
    """
    import datasets

    options = ChatOptions(
        column=column, max_length=max_length, overflow=overflow, assistant_spans=assistant_spans,
        label_pad_id=label_pad_id, drop_untrained=drop_untrained, num_proc=num_proc, keep_in_memory=keep_in_memory,
    )  # fmt: skip
    if isinstance(dataset, datasets.Dataset):
        tokenized, stats = _tokenize_split(dataset, tokenizer, options)
    elif isinstance(dataset, datasets.DatasetDict):
        tokenize = lambda split, name: _tokenize_split(split, tokenizer, options, name)  # noqa: E731
        tokenized, stats = per_split(dataset, tokenize, datasets.DatasetDict)
    else:
        raise TypeError(
            f"tokenize_chat takes a datasets.Dataset or DatasetDict, got {type(dataset).__name__}; tokenize one "
            "example at a time with tokenize_chat_example."
        )
    return (tokenized, stats) if return_stats else tokenized
