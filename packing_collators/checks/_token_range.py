"""Before the first step: there is something to train on, and every token id has an embedding row.

    check_training_data(model, dataset)
        len(dataset) == 0                    ValueError: ... no examples ... training would run no step
        an id >= embedding rows (e.g. 32000) ValueError: Example 7: input_ids holds token id 32000, but the
                                             model's input embedding has 32000 rows (ids 0-31999) ...
        a negative id                        ValueError: Example 7: input_ids holds token id -100 ...

An id past the embedding fails far from its cause (an index error inside the embedding, or a
device-side assert on a GPU, at some step), and an empty dataset trains 0 steps with only
transformers' warning. Cost: one pass over the ids: ``pyarrow.compute.min_max`` over the list
column's values for a ``datasets.Dataset`` (vectorised, no Python object per token), else one ``min``/``max`` per example. Run once, when training begins.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import dataset_indices

__all__ = ["check_training_data", "refuse_no_batches", "refuse_no_examples"]


def refuse_no_examples(count: int, what: str = "train_dataset") -> None:
    """Refuse to train on a dataset with no examples (or none left after dropping).

    >>> refuse_no_examples(0)
    Traceback (most recent call last):
    ...
    ValueError: The train_dataset has no examples, so training would run no step. Check the data loading (a filter that kept nothing, an empty split or file) before training.
    """
    if count == 0:
        raise ValueError(
            f"The {what} has no examples, so training would run no step. Check the data loading (a filter that "
            "kept nothing, an empty split or file) before training."
        )


def refuse_no_batches(loader) -> None:
    """Refuse a train dataloader with no batches (every example dropped, or fewer than a batch with drop_last)."""
    try:
        count = len(loader)
    except TypeError:  # a stream: its length is unknown until read
        return
    if count == 0:
        raise ValueError(
            f"The train dataloader yields no batch from its {len(loader.dataset)} examples (every example dropped, "
            "e.g. overflow='drop' with examples all longer than the token budget, or fewer examples than one batch "
            "with dataloader_drop_last=True), so training would run no step. Keep more examples, raise the budget "
            "or batch size, or turn drop_last off."
        )


def _embedding_rows(model) -> int | None:
    """Rows of the model's input embedding (``get_input_embeddings().num_embeddings``), or None if it has none."""
    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    rows = getattr(embedding, "num_embeddings", None)
    return int(rows) if isinstance(rows, (int, np.integer)) else None


def _arrow_bad_example(dataset, column: str, rows: int) -> tuple[int, int] | None:
    """(example index in ``dataset``'s order, the bad id) of the first out-of-range example, or None; Arrow only."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    values = table.column(column)
    if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
        return None
    flat = pc.list_flatten(values)
    if not len(flat):
        return None
    bounds = pc.min_max(flat).as_py()
    if bounds["min"] >= 0 and bounds["max"] < rows:
        return None  # the usual case: one vectorised pass, nothing else
    ids = flat.to_numpy(zero_copy_only=False)
    bad_tokens = np.flatnonzero((ids < 0) | (ids >= rows))
    offsets = np.r_[0, np.cumsum(pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False))]
    bad_rows = np.searchsorted(offsets, bad_tokens, side="right") - 1
    indices = dataset_indices(dataset)  # a select/shuffle/filter view: only its rows count, in its order
    if indices is None:
        return int(bad_rows[0]), int(ids[bad_tokens[0]])
    order = indices.column(0).to_numpy()
    hit = np.flatnonzero(np.isin(order, bad_rows))
    if not len(hit):
        return None
    example = int(hit[0])
    first_token = bad_tokens[np.searchsorted(bad_rows, order[example])]
    return example, int(ids[first_token])


def _python_bad_example(dataset, column: str, rows: int) -> tuple[int, int] | None:
    """The same for any map-style dataset: one ``min``/``max`` per example."""
    for i in range(len(dataset)):
        ids = np.asarray(dataset[i][column])
        if ids.size and (ids.min() < 0 or ids.max() >= rows):
            return i, int(ids[(ids < 0) | (ids >= rows)][0])
    return None


def check_training_data(model, dataset: Any, column: str = "input_ids") -> None:
    """Refuse an empty train dataset, or a token id outside the model's input embedding, naming the example.

    >>> from datasets import Dataset
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
    ...                                      num_attention_heads=2, intermediate_size=8))
    >>> check_training_data(model, Dataset.from_dict({"input_ids": [[1, 2], [3, 15]]}))
    >>> check_training_data(model, Dataset.from_dict({"input_ids": [[1, 2], [3, 16]]}))
    Traceback (most recent call last):
    ...
    ValueError: Example 1: input_ids holds token id 16, but the model's input embedding has 16 rows (ids 0-15). The data was tokenized for another model, or the tokenizer gained tokens: model.resize_token_embeddings(len(tokenizer)), or tokenize again with this model's tokenizer.
    """
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        return  # a stream: nothing can be read ahead of training
    refuse_no_examples(len(dataset))
    rows = _embedding_rows(model)
    if rows is None:
        return
    bad = None
    try:
        import datasets

        if isinstance(dataset, datasets.Dataset):
            if column not in dataset.column_names:
                return
            bad = _arrow_bad_example(dataset, column, rows)
        else:
            bad = _python_bad_example(dataset, column, rows)
    except (KeyError, TypeError, ValueError):  # examples that are not dicts of id lists: the collator will say
        return
    if bad is not None:
        example, token = bad
        raise ValueError(
            f"Example {example}: {column} holds token id {token}, but the model's input embedding has {rows} rows "
            f"(ids 0-{rows - 1}). The data was tokenized for another model, or the tokenizer gained tokens: "
            "model.resize_token_embeddings(len(tokenizer)), or tokenize again with this model's tokenizer."
        )
