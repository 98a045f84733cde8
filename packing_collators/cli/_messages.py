"""Library errors in the command line's own words: ``overflow='split'`` becomes ``--overflow split``.

The library's messages name its keyword arguments (``pack_dataset(..., overflow='split')``); the
command line surfaces the same messages, so each is rewritten once, here, at the boundary, instead
of being written twice::

    overflow='truncate'                       ->  --overflow truncate
    more than max_length=16 ... raise max_length  ->  more than --max-length 16 ... raise --max-length
    shard_index=5 ... num_shards=2            ->  --shard-index 5 ... --num-shards 2
    keep_columns, num_proc, column=           ->  --keep-column, --num-proc, --column
    (dataset.remove_columns(['labels']))      ->  (--remove-column labels)

Cost: a few regular expressions over one line, once per failed command.
"""

from __future__ import annotations

import re

__all__ = ["as_command_line"]

_OPTIONS = {
    "max_length": "--max-length",
    "overflow": "--overflow",
    "strategy": "--strategy",
    "num_shards": "--num-shards",
    "shard_index": "--shard-index",
    "num_proc": "--num-proc",
    "keep_columns": "--keep-column",
    "column": "--column",
}
_VALUE = r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|[\w.-]+"
# a keyword inside a call (``PrePackedCollator(keep_columns=[...])``) is Python to type, not an option
_WITH_VALUE = re.compile(r"(?<![\w.(-])(" + "|".join(_OPTIONS) + r")=(" + _VALUE + ")?")
# bare names only where they cannot be English words: the ones with an underscore
_BARE = re.compile(r"(?<![\w.-])(" + "|".join(name for name in _OPTIONS if "_" in name) + r")\b(?![(=])")
_REMOVE = re.compile(r"\(?dataset\.remove_columns\(\[([^\]]*)\]\)\)?")


def _names(listed: str) -> list[str]:
    return [name.strip().strip("'\"") for name in listed.split(",") if name.strip()]


def _with_value(match: re.Match) -> str:
    option, value = _OPTIONS[match.group(1)], match.group(2) or ""
    if value.startswith("["):
        return " ".join(f"{option} {name}" for name in _names(value[1:-1])) or option
    return f"{option} {value.strip(chr(39) + chr(34))}".rstrip()


def _remove(match: re.Match) -> str:
    return "(" + " ".join(f"--remove-column {name}" for name in _names(match.group(1))) + ")"


def as_command_line(message: str) -> str:
    """``message`` with the library's keyword arguments written as this command's options.

    >>> as_command_line("Example 3 has 40 tokens, more than max_length=16. Pass overflow='split' "
    ...                 "(keep every token, in pieces), overflow='truncate' or overflow='drop', or raise max_length.")
    'Example 3 has 40 tokens, more than --max-length 16. Pass --overflow split (keep every token, in pieces), --overflow truncate or --overflow drop, or raise --max-length.'
    >>> as_command_line("shard_index=5 is out of range for num_shards=2; shards are numbered 0 to 1.")
    '--shard-index 5 is out of range for --num-shards 2; shards are numbered 0 to 1.'
    >>> as_command_line("remove them first (dataset.remove_columns(['labels'])).")
    'remove them first (--remove-column labels).'
    >>> as_command_line("name it in keep_columns=['source'] or pass column= with one; the overflow strategy stays")
    'name it in --keep-column source or pass --column with one; the overflow strategy stays'
    >>> as_command_line("collate with PrePackedCollator(keep_columns=['source'])")
    "collate with PrePackedCollator(keep_columns=['source'])"
    """
    message = _REMOVE.sub(_remove, message)
    message = _WITH_VALUE.sub(_with_value, message)
    return _BARE.sub(lambda match: _OPTIONS[match.group(1)], message)
