"""Names a package hands on from modules it imports only when a name is first used: one rule for every facade.

    __getattr__ = lazy_names(__name__, {"PackingTrainer": ".trainer"}, moved={"CompileReport": "packing_collators.trainer"})

    packing_collators.PackingTrainer   imports .trainer (transformers' Trainer: seconds) on first use, then is plain
    packing_collators.CompileReport    AttributeError naming where it lives now
    packing_collators.nothing          AttributeError, as for any module

So ``import packing_collators`` stays fast and free of torch. Cost: one import on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str], *, moved: Mapping[str, str] | None = None):
    """A module ``__getattr__`` for ``package``: ``homes[name]`` (a module, relative to ``package``) is imported on
    first use and ``name`` taken from it; a name in ``moved`` is an AttributeError saying where it lives now.

    >>> getattr_ = lazy_names("packing_collators", {"pack_lengths": ".engine"}, moved={"Old": "packing_collators.engine"})
    >>> getattr_("pack_lengths").__name__
    'pack_lengths'
    >>> getattr_("Old")
    Traceback (most recent call last):
    ...
    AttributeError: packing_collators.Old is no longer in packing_collators: from packing_collators.engine import Old
    """

    def __getattr__(name: str):
        home = homes.get(name)
        if home is not None:
            return getattr(importlib.import_module(home, package), name)
        if moved and name in moved:
            raise AttributeError(f"{package}.{name} is no longer in {package}: from {moved[name]} import {name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
