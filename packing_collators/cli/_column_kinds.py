"""Which column of the data holds what the command line reads, and which columns can go into packed rows.

    list of integers  tokens        integer  lengths        string  text
    list of structs   messages      prompt and completion columns   prompt_completion

By default the first of ``input_ids``, ``messages``, ``prompt`` and ``completion``, ``text``
(``--column`` names another). A column that holds none of these is a ``TypeError`` naming its
Arrow type; a missing column a ``ValueError`` naming the columns there. Cost: a schema read.
"""

from __future__ import annotations

from typing import Any, Literal

from ..chat import PROMPT_COMPLETION
from ..offline import is_per_token

__all__ = ["AUTO_COLUMNS", "ColumnKind", "choose_column", "column_kind", "packable_columns", "without_columns"]

ColumnKind = Literal["tokens", "lengths", "text", "messages", "prompt_completion"]
AUTO_COLUMNS = ("input_ids", "messages", "text")


def column_kind(dataset: Any, column: str) -> ColumnKind:
    """What ``column`` holds: token ids, lengths, text or messages; a TypeError for anything else.

    >>> from datasets import Dataset
    >>> data = Dataset.from_dict({"input_ids": [[1, 2]], "length": [2], "text": ["a b"], "score": [[0.5, 1.0]]})
    >>> [column_kind(data, name) for name in ("input_ids", "length", "text")]
    ['tokens', 'lengths', 'text']
    >>> column_kind(data, "score")
    Traceback (most recent call last):
    ...
    TypeError: Column 'score' holds list<item: double>, not token data: it must hold token ids (a list of integers per example) or lengths (one integer per example), or be text or messages to tokenize with --tokenizer.
    """
    import pyarrow as pa

    kind = dataset.data.schema.field(column).type
    if pa.types.is_integer(kind):
        return "lengths"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        value = kind.value_type
        if pa.types.is_integer(value):
            return "tokens"
        if pa.types.is_struct(value) and value.get_field_index("content") >= 0:
            return "messages"
        if getattr(value, "extension_name", None) == "arrow.json":  # datasets' Json: messages of differing keys
            return "messages"  # each message is checked as it is tokenized
        if pa.types.is_struct(value) and value.get_field_index("role") >= 0:
            keys = [value.field(i).name for i in range(value.num_fields)]
            raise ValueError(
                f"Column {column!r} holds messages with no 'content' (their keys: {keys}, from example 0 on); each "
                "message needs 'role' and 'content', e.g. {'role': 'user', 'content': 'hi'}: rename the key first."
            )
    raise TypeError(
        f"Column {column!r} holds {kind}, not token data: it must hold token ids (a list of integers per example) "
        "or lengths (one integer per example), or be text or messages to tokenize with --tokenizer."
    )


def choose_column(dataset: Any, column: str | None = None) -> tuple[str, ColumnKind]:
    """``(column, kind)``: the named column, or the first of ``input_ids``, ``messages``, prompt/completion, ``text``.

    Prompt/completion data is named by its ``prompt`` column, of kind ``prompt_completion``.

    >>> from datasets import Dataset
    >>> choose_column(Dataset.from_dict({"text": ["a b"], "input_ids": [[1, 2]]}))
    ('input_ids', 'tokens')
    >>> choose_column(Dataset.from_dict({"prompt": ["2 + 2?"], "completion": ["4."]}))
    ('prompt', 'prompt_completion')
    >>> choose_column(Dataset.from_dict({"text": ["a b"]}), "labels")
    Traceback (most recent call last):
    ...
    ValueError: The dataset has no column 'labels' (its columns: ['text']); pass --column with one of them.
    """
    names = list(dataset.column_names)
    if column is None:
        column = next((name for name in AUTO_COLUMNS[:2] if name in names), None)
        if column is None and set(PROMPT_COMPLETION) <= set(names):
            return "prompt", "prompt_completion"
        column = column or ("text" if "text" in names else None)
        if column is None:
            raise ValueError(
                f"The dataset has none of the columns {list(AUTO_COLUMNS)} nor both 'prompt' and 'completion' "
                f"(its columns: {names}); pass --column with the one holding token ids, lengths, text or messages."
            )
    elif column not in names:
        raise ValueError(
            f"The dataset has no column {column!r} (its columns: {names}); pass --column with one of them."
        )
    return column, column_kind(dataset, column)


def without_columns(dataset: Any, remove_columns=()):
    """The dataset without ``remove_columns`` (``--remove-column``), each of which it must have.

    ``pack`` removes them before tokenizing, so a column that tokenizing would write (``labels``
    beside ``messages``) can be removed as the error about it says.

    >>> from datasets import Dataset
    >>> without_columns(Dataset.from_dict({"input_ids": [[1, 2]], "id": [7]}), ["id"]).column_names
    ['input_ids']
    """
    unknown = [name for name in remove_columns if name not in dataset.column_names]
    if unknown:
        raise ValueError(
            f"The dataset has no column(s) {unknown} (its columns: {list(dataset.column_names)}); check --remove-column."
        )
    return dataset.remove_columns(list(remove_columns)) if remove_columns else dataset


def packable_columns(dataset: Any, *, keep_columns=(), remove_columns=()):
    """The dataset without ``remove_columns``, once every other column can go into packed rows.

    A column goes into packed rows if it is per token (a list of numbers, concatenated) or
    kept (``--keep-column``: one value per example, as a list per row). All the others are
    named in one error, with both fixes.

    >>> from datasets import Dataset
    >>> data = Dataset.from_dict({"input_ids": [[1, 2]], "id": [7], "source": ["web"]})
    >>> packable_columns(data, keep_columns=["source"], remove_columns=["id"]).column_names
    ['input_ids', 'source']
    >>> packable_columns(data)
    Traceback (most recent call last):
    ...
    ValueError: Columns ['id', 'source'] are not per-token, so they cannot be concatenated into packed rows; pass --remove-column NAME to leave one out (training needs only the per-token columns), or --keep-column NAME to keep it as a list per row, one value per example (to train on the rows, remove it then, or collate with PrePackedCollator(keep_columns=[NAME]) and take it out of the batch before the model's forward).
    """
    names = list(dataset.column_names)
    unknown = [name for name in [*keep_columns, *remove_columns] if name not in names]
    if unknown:
        raise ValueError(
            f"The dataset has no column(s) {unknown} (its columns: {names}); check --keep-column and --remove-column."
        )
    dataset = without_columns(dataset, remove_columns)
    schema = dataset.data.schema
    refused = [n for n in dataset.column_names if n not in keep_columns and not is_per_token(schema.field(n).type)]
    if refused:
        raise ValueError(
            f"Columns {refused} are not per-token, so they cannot be concatenated into packed rows; pass "
            "--remove-column NAME to leave one out (training needs only the per-token columns), or --keep-column "
            "NAME to keep it as a list per row, one value per example (to train on the rows, remove it then, or "
            "collate with PrePackedCollator(keep_columns=[NAME]) and take it out of the batch before the model's "
            "forward)."
        )
    return dataset
