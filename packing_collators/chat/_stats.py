"""What :func:`tokenize_chat` made of a dataset: examples and tokens kept and trained, and what was lost.

    examples 4 -> kept 3    tokens 120, trained 48 (40.00%)
    max_length 64: truncated 1 (10 tokens cut), dropped 0 (0 tokens); dropped 0 with no trained token

Nothing is lost silently: every truncated or dropped example is counted here and in the log line
(:meth:`ChatStats.summary`). Cost: constant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["ChatStats"]


@dataclass(frozen=True)
class ChatStats:
    """Counts of one :func:`tokenize_chat` run (one split).

    Attributes:
        examples: examples in the input.
        kept_examples: examples in the output.
        tokens: tokens in the output (after truncation).
        trained_tokens: tokens of the output whose label is not ``label_pad_id``.
        max_length: the limit, or None for none.
        truncated_examples, truncated_tokens: examples cut to ``max_length``, tokens cut off them.
        dropped_examples, dropped_tokens: examples over ``max_length`` left out (``overflow="drop"``).
        untrained_examples: examples left out for having no trained token (no assistant turn to
            train, or one truncated away), when ``drop_untrained``.

    >>> ChatStats(examples=4, kept_examples=3, tokens=120, trained_tokens=48, max_length=64,
    ...           truncated_examples=1, truncated_tokens=10, untrained_examples=1).summary()
    '4 examples -> 3 kept, 120 tokens (48 trained, 40.00%); max_length 64: truncated 1 (10 tokens cut), dropped 0 (0 tokens); 1 with no trained token dropped'
    """

    examples: int
    kept_examples: int
    tokens: int
    trained_tokens: int
    max_length: int | None = None
    truncated_examples: int = 0  # overflow="truncate": cut to max_length
    truncated_tokens: int = 0
    dropped_examples: int = 0  # overflow="drop": left out
    dropped_tokens: int = 0
    untrained_examples: int = 0  # drop_untrained: no trained token

    @property
    def lost(self) -> bool:
        """Whether any example was truncated or left out."""
        return bool(self.truncated_examples or self.dropped_examples or self.untrained_examples)

    def summary(self) -> str:
        """One line for a log."""
        share = self.trained_tokens / self.tokens if self.tokens else 0.0
        limit = (
            f"max_length {self.max_length}: truncated {self.truncated_examples:,} ({self.truncated_tokens:,} tokens cut), "
            f"dropped {self.dropped_examples:,} ({self.dropped_tokens:,} tokens)"
            if self.max_length is not None
            else "no max_length"
        )
        return (
            f"{self.examples:,} examples -> {self.kept_examples:,} kept, {self.tokens:,} tokens "
            f"({self.trained_tokens:,} trained, {share:.2%}); {limit}; "
            f"{self.untrained_examples:,} with no trained token dropped"
        )

    def as_dict(self) -> dict:
        """The counts as a plain dict (for logging or JSON)."""
        return asdict(self)
