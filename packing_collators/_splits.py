"""One call per split of a ``DatasetDict`` (or ``IterableDatasetDict``), its results gathered back per split.

    DatasetDict {"train": d1, "test": d2}  --fn(d, name)-->  (DatasetDict {"train": r1, "test": r2},
                                                              {"train": s1, "test": s2})

What ``pack_dataset``, its streaming path and ``tokenize_chat`` do with a dict of splits.
Cost: one call per split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["per_split"]


def per_split(splits: Mapping[str, Any], fn: Callable[[Any, str], tuple[Any, Any]], dict_type: type) -> tuple:
    """``(dict_type of each split's first result, dict of its second)``: ``fn(split, name)`` split by split.

    >>> per_split({"train": [1, 2], "test": [3]}, lambda split, name: (sum(split), name.upper()), dict)
    ({'train': 3, 'test': 3}, {'train': 'TRAIN', 'test': 'TEST'})
    """
    results = {name: fn(split, name) for name, split in splits.items()}
    return dict_type({name: result[0] for name, result in results.items()}), {
        name: result[1] for name, result in results.items()
    }
