""":func:`tokenize_chat`'s options as one frozen keyword-only dataclass, validated once when it is built.

    ChatOptions(column=None, max_length=None, overflow="error", assistant_spans="auto",
                label_pad_id=-100, drop_untrained=True, num_proc=None, keep_in_memory=False)

:func:`tokenize_chat` takes these as keyword arguments (so ``help()`` lists them), builds one
``ChatOptions`` from them and hands it to every split it tokenizes. Cost: constant.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validation import validate_choice, validate_positive_int
from ..engine import WHOLE_EXAMPLES, Overflow
from ._assistant_spans import AssistantSpans

__all__ = ["ChatOptions"]


@dataclass(frozen=True, kw_only=True)
class ChatOptions:
    """Validated :func:`tokenize_chat` options (see it for what each does).

    >>> ChatOptions(max_length=512, overflow="truncate").truncates
    True
    >>> ChatOptions(overflow="cut")
    Traceback (most recent call last):
    ...
    ValueError: overflow='cut' is not supported; choose one of 'error', 'truncate', 'drop'.
    """

    column: str | None = None
    max_length: int | None = None
    overflow: Overflow = "error"
    assistant_spans: AssistantSpans = "auto"
    label_pad_id: int = -100
    drop_untrained: bool = True
    num_proc: int | None = None
    keep_in_memory: bool = False

    def __post_init__(self) -> None:
        validate_choice("overflow", self.overflow, WHOLE_EXAMPLES)
        validate_choice("assistant_spans", self.assistant_spans, AssistantSpans)
        limit = validate_positive_int("max_length", self.max_length, allow_none=True, none_means="no limit")
        num_proc = validate_positive_int("num_proc", self.num_proc, allow_none=True, none_means="one process")
        object.__setattr__(self, "max_length", limit)
        object.__setattr__(self, "num_proc", num_proc)
        object.__setattr__(self, "label_pad_id", int(self.label_pad_id))
        object.__setattr__(self, "drop_untrained", bool(self.drop_untrained))

    @property
    def truncates(self) -> bool:
        """Whether examples over ``max_length`` are cut to it."""
        return self.max_length is not None and self.overflow == "truncate"

    @property
    def map_processes(self) -> int | None:
        """``num_proc`` as ``datasets.map`` takes it: None for one process."""
        return self.num_proc if self.num_proc and self.num_proc > 1 else None
