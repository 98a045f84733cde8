"""The command line's DATA argument: open it as a ``datasets.Dataset``, pick its column, count tokens.

    DATA (folder, .parquet/.arrow/.json(l)/.csv, Hub name)   -> _open_data.open_dataset
      -> the column and what it holds (token ids, lengths, text, messages, prompt/completion)
                                                              -> _column_kinds.choose_column
      -> token counts (analyze) or input_ids (pack)           -> _tokens.read_lengths / token_ids

Each step has a module of its own, with its table and costs; this module is the command line's
one door to them. Every problem is a ``ValueError``/``TypeError``/``FileNotFoundError`` whose
message is one line naming the fix. Cost: that of the steps.
"""

from __future__ import annotations

from ._column_kinds import ColumnKind, choose_column, column_kind, packable_columns, without_columns
from ._open_data import open_dataset
from ._tokens import load_tokenizer, read_lengths, token_ids

__all__ = [
    "ColumnKind",
    "choose_column",
    "column_kind",
    "load_tokenizer",
    "open_dataset",
    "packable_columns",
    "read_lengths",
    "token_ids",
    "without_columns",
]
