"""The command line's DATA argument: open it as a ``datasets.Dataset``, pick its column, count tokens.

DATA may be::

    a save_to_disk folder         load_from_disk (a DatasetDict: --split picks one, default "train")
    a folder of data files        load_dataset(folder)
    data.parquet, data.arrow      read with pyarrow (the .arrow file memory-mapped), no cache written
    data.json(l), data.csv        load_dataset("json" or "csv", data_files=...)
    owner/name                    load_dataset(name) from the Hugging Face Hub

The column (``--column``; by default the first of ``input_ids``, ``messages``, ``prompt`` and
``completion``, ``text``)::

    list of integers   token ids     lengths read from the Arrow offsets (lengths_from_dataset)
    integer            lengths       read as they are (the fast path: 1M examples in milliseconds)
    string             text          tokenized with --tokenizer
    list of structs    messages      chat messages, tokenized with the tokenizer's chat template
    prompt/completion  prompt_completion   instruction pairs (strings or messages), the same way

``pack`` tokenizes chat data with :func:`tokenize_chat`, so the packed rows carry ``labels``
that train only the assistant's tokens; ``analyze`` only counts the rendered tokens.

Tokenizing is a batched ``Dataset.map`` over ``num_proc`` processes with a progress bar,
kept in memory (nothing is written next to the user's data). Every problem is a
``ValueError``/``TypeError``/``FileNotFoundError`` whose message is one line naming the fix:
data with no examples, and a .json/.jsonl/.csv file that does not parse (a .jsonl file's
first bad line is named). Those files are read without ``datasets``' progress bar and logs,
which would turn the one-line error into several.

Each step has a module of its own: ``_open_data`` (DATA to a dataset), ``_column_kinds`` (which
column, holding what; which columns can go into packed rows) and ``_tokens`` (token counts or ids,
tokenizing if it must); this module is the command line's one door to them.
"""

from __future__ import annotations

from ._column_kinds import ColumnKind, choose_column, column_kind, packable_columns, without_columns
from ._open_data import open_dataset
from ._tokens import example_lengths, load_tokenizer, token_ids

__all__ = [
    "ColumnKind",
    "choose_column",
    "column_kind",
    "example_lengths",
    "load_tokenizer",
    "open_dataset",
    "packable_columns",
    "token_ids",
    "without_columns",
]
