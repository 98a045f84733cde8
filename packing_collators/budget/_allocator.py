"""CUDA's caching allocator without fragmentation, for a token budget that fills the card.

A budget measured to fill 90% of the GPU (``max_tokens_per_batch="auto"``) leaves ~8 GiB on an 80 GB card, and
packed micro-batches change size every step: with its default fixed-size segments the caching allocator keeps
freed blocks of the old sizes, and a later step's large activation can find no block to fit although enough
bytes are free (reserved but unallocated memory of gigabytes, at a step the dry runs measured within budget).
Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) grow one mapping instead, so
reserved memory follows allocated memory. The setting can change at run time and applies to segments made
after it; a user's own choice of allocator is left alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

__all__ = ["allocator_setting", "avoid_fragmentation"]

logger = logging.getLogger(__name__)

EXPANDABLE = "expandable_segments:True"
_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def allocator_setting(environ: Mapping[str, str]) -> str | None:
    """The setting to apply, or None where the user configured expandable segments or another allocator.

    >>> allocator_setting({})
    'expandable_segments:True'
    >>> allocator_setting({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"})
    'expandable_segments:True'
    >>> allocator_setting({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}) is None  # the user's choice
    True
    >>> allocator_setting({"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}) is None  # no caching allocator
    True
    """
    configured = ",".join(environ.get(name, "") for name in _VARIABLES)
    if "expandable_segments" in configured or "cudaMallocAsync" in configured:
        return None
    return EXPANDABLE


def avoid_fragmentation(device) -> bool:
    """Turn on expandable segments for the CUDA caching allocator (see the module); whether it was turned on."""
    import torch

    if getattr(device, "type", None) != "cuda":
        return False
    setting = allocator_setting(os.environ)
    if setting is None:
        return False
    try:
        torch.cuda.memory._set_allocator_settings(setting)
    except (AttributeError, RuntimeError) as error:  # an allocator or torch version without the setting
        logger.info("packing_collators: expandable segments not available (%s)", error)
        return False
    logger.warning(
        "packing_collators: the token budget fills the GPU, so CUDA's allocator now uses expandable segments "
        "(as PYTORCH_CUDA_ALLOC_CONF=%s would; set that variable yourself to choose otherwise).",
        setting,
    )
    return True
