"""The verdict on a shared-prompt layout measured on a model: the same log-probabilities shared and unshared, and
nothing of one completion reaching another.

    (|shared - unshared|, leak, dtype of the forward)  ->  logged; refused with both numbers and the fix when
    the difference passes its tolerance, or a leak is not 0 (float32) / passes the tolerance (half precision)

What each trainer measures it on is its own (DPO: its pairs; GRPO: token groups); the rule is one.
Cost: none.
"""

from __future__ import annotations

import logging

__all__ = ["refuse_shared_layout_change"]

logger = logging.getLogger(__name__)


def refuse_shared_layout_change(who: str, difference: float, leak: float, *, exact: bool, allowed: float,
                                moved: str) -> None:  # fmt: skip
    """Raise a ValueError naming the measurement and the fix where the shared layout changed a model's numbers.

    ``exact``: the forward ran in float32 (a leak must be 0); ``moved``: what the leak moved, in words.

    >>> refuse_shared_layout_change("X", 0.0, 0.0, exact=True, allowed=1e-5, moved="a completion moves the others")
    >>> refuse_shared_layout_change("X", 0.0, 1e-7, exact=True, allowed=1e-5, moved="a completion moves the others")
    Traceback (most recent call last):
    ...
    ValueError: share_prompt=True changes this model's log-probabilities: shared against unshared 0 (tolerance 1e-05); a completion moves the others by 1e-07 (must be 0). Its attention or a layer does not keep the shared layout: train with share_prompt=False.
    """
    logger.info("%s: shared prompts: |shared - unshared| %.3g (tolerance %.3g), leak %.3g", who, difference, allowed, leak)
    if (leak if exact else leak > allowed) or difference > allowed:
        raise ValueError(
            f"share_prompt=True changes this model's log-probabilities: shared against unshared {difference:.3g} "
            f"(tolerance {allowed:.3g}); {moved} by {leak:.3g} (must be {'0' if exact else f'within {allowed:.3g}'}). "
            "Its attention or a layer does not keep the shared layout: train with share_prompt=False."
        )
