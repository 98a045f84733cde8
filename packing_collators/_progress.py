"""Progress bars for long work (``pack_dataset``, planning an epoch, ``packing-collators analyze``), by one rule.

    progress=True    a bar
    progress=False   no bar
    progress=None    a bar when the work is long (at least the caller's threshold, e.g.
                     4,000,000 examples to plan) and progress bars are on in both
                     ``datasets`` and ``transformers``

Progress bars are off in ``datasets`` after ``datasets.disable_progress_bars()`` or with
``HF_DATASETS_DISABLE_PROGRESS_BARS=1``, and off in ``transformers`` after
``transformers.utils.logging.disable_progress_bar()`` or with ``HF_HUB_DISABLE_PROGRESS_BARS=1``
(huggingface_hub's switch, which transformers starts from). Neither library is imported to
decide (each import costs seconds): a library not imported yet cannot have been switched off
in this process, so its environment variable decides.

The bar is ``tqdm.auto``'s on stderr, imported only when a bar is shown, and moves once per
chunk of work (a packed group, a stage of the analysis), never per example. Cost: deciding is
a few dict lookups; a shown bar costs tqdm's import once and a few redraws, nothing per example.
"""

from __future__ import annotations

import os
import sys

__all__ = ["NoBar", "bars_enabled", "progress_bar", "show_progress", "validate_progress"]

_TRUE = {"1", "ON", "YES", "TRUE"}  # what datasets and huggingface_hub read as true


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").upper() in _TRUE


def bars_enabled() -> bool:
    """Whether progress bars are on in both ``datasets`` and ``transformers`` (imports neither).

    >>> import datasets
    >>> datasets.disable_progress_bars(); bars_enabled()
    False
    >>> datasets.enable_progress_bars()
    """
    datasets_logging = sys.modules.get("datasets.utils.logging")
    if datasets_logging is not None:
        if not datasets_logging.is_progress_bar_enabled():
            return False
    elif _env_true("HF_DATASETS_DISABLE_PROGRESS_BARS"):
        return False
    transformers_logging = sys.modules.get("transformers.utils.logging")
    if transformers_logging is not None:
        return bool(transformers_logging.is_progress_bar_enabled())
    hub = sys.modules.get("huggingface_hub.utils")
    if hub is not None:
        return not hub.are_progress_bars_disabled()
    return not _env_true("HF_HUB_DISABLE_PROGRESS_BARS")


def validate_progress(progress) -> bool | None:
    """``progress`` if it is True, False or None, else a TypeError.

    >>> validate_progress("yes")
    Traceback (most recent call last):
    ...
    TypeError: progress must be True, False or None (None: a bar for long work only), got 'yes'.
    """
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None (None: a bar for long work only), got {progress!r}.")
    return progress


def show_progress(progress: bool | None, work: int, threshold: int) -> bool:
    """``progress`` when given, else whether ``work`` reaches ``threshold`` and bars are enabled.

    >>> show_progress(None, 10, threshold=1_000_000), show_progress(True, 10, threshold=1_000_000)
    (False, True)
    """
    if validate_progress(progress) is not None:
        return bool(progress)
    return work >= threshold and bars_enabled()


class NoBar:
    """What :func:`progress_bar` gives when no bar is shown: every call does nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def __enter__(self) -> NoBar:
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress_bar(show: bool, *, total: int, desc: str, unit: str):
    """A ``tqdm.auto`` bar on stderr (a context manager), or a :class:`NoBar` when ``show`` is False.

    >>> with progress_bar(False, total=3, desc="planning", unit="example") as bar:
    ...     bar.update(3)
    >>> type(bar).__name__
    'NoBar'
    """
    if not show:
        return NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=total >= 10_000, file=sys.stderr)  # 2.00M, not 2000000
