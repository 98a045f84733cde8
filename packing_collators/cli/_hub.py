"""A tokenizer named on the Hub, said to be out of reach at once instead of after the loaders' retries.

``from_pretrained("owner/name")`` with no network retries for about 25 to 50 s before its error, and
under ``HF_HUB_OFFLINE=1`` its error says "check your internet connection". Before loading::

    a local folder                                  -> loaded as it is
    HF_HUB_OFFLINE=1, the name in the Hub cache     -> loaded from the cache
    HF_HUB_OFFLINE=1, not in the cache              -> ConnectionError now: the name, and the fix
    the Hub answers a HEAD request within 3 s       -> loaded as usual
    it does not, the name in the Hub cache          -> loaded from the cache (local_files_only=True)
    it does not, not in the cache                   -> ConnectionError now: the name, why, and the fix

Cost: one HEAD request to the Hub endpoint (a DNS failure answers in milliseconds, a dropped
connection in at most 3 s), only for a name that is not a local folder.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["hub_load_options"]

PROBE_SECONDS = 3.0


def offline_mode() -> bool:
    """Whether Hub downloads are off: ``huggingface_hub``'s ``HF_HUB_OFFLINE`` (read when it was imported), or the
    variable set since."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def in_hub_cache(name: str, repo_type: str = "model") -> bool:
    """Whether ``name`` has a downloaded snapshot in the Hub cache (``models--owner--name/snapshots/...``)."""
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{name.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def hub_unreachable() -> str | None:
    """Why the Hub endpoint cannot be reached (one HEAD request, at most 3 s), or None when it answers."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_SECONDS)
    except Exception as error:  # any transport failure (DNS, refused, timeout, proxy): the loaders would retry
        return f"{constants.ENDPOINT} does not answer ({type(error).__name__}: {' '.join(str(error).split())[:120]})"
    return None


def hub_load_options(name: str, *, what: str = "--tokenizer") -> dict[str, bool]:
    """The keyword arguments to load ``name`` with (``{}``, or ``local_files_only=True`` from the Hub cache), or a
    ``ConnectionError`` at once when ``name`` is a Hub name that cannot be downloaded now.

    >>> hub_load_options(".")  # a local folder: no look at the Hub
    {}
    """
    if Path(name).expanduser().exists():
        return {}
    cached = in_hub_cache(name)
    if offline_mode():
        if cached:
            return {}
        raise ConnectionError(
            f"{what} {name!r} is not a local folder, and HF_HUB_OFFLINE=1 forbids downloading it from the Hub (it is "
            "not in the Hub cache). Pass a folder saved with save_pretrained, or unset HF_HUB_OFFLINE on a machine "
            "with network access (once downloaded, it loads offline from the cache)."
        )
    why = hub_unreachable()
    if why is None:
        return {}
    if cached:
        return {"local_files_only": True}
    raise ConnectionError(
        f"{what} {name!r} is not a local folder, and the Hub cannot be reached: {why}. Pass a folder saved with "
        "save_pretrained (or download it where there is network), or connect this machine; HF_HUB_OFFLINE=1 "
        "loads only what the Hub cache holds."
    )
