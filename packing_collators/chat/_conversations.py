"""A dataset row as one conversation: its messages, and the first turn that is trained.

    row                                                   messages                        trained from turn
    {"messages": [system, user, assistant, user, assistant]}   as given                    0 (every assistant turn)
    {"prompt": "2 + 2?", "completion": "4."}              [user "2 + 2?", assistant "4."]  1
    {"prompt": [system, user], "completion": [assistant]} prompt + completion             2
    {"prompt": [user, assistant, user], "completion": [assistant]}                        3 (the prompt's
                                                                                            assistant turn is not)

Only the assistant turns from the first trained turn on are trained; every other token is prompt.
A string prompt is one user turn and a string completion one assistant turn, so both go through
the chat template, as TRL's conversational prompt/completion data does. Cost: a type check per
message; no tokenizer here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PROMPT_COMPLETION", "chat_columns", "check_message", "conversation_of"]

PROMPT_COMPLETION = ("prompt", "completion")
_MESSAGE_SHAPE = "a list of {'role': ..., 'content': ...} dicts"


def chat_columns(column_names: Sequence[str], column: str | None = None) -> tuple[str, ...]:
    """The columns that hold the chat: ``(column,)``, else ``("messages",)``, else ``("prompt", "completion")``.

    >>> chat_columns(["messages", "source"]), chat_columns(["prompt", "completion", "id"])
    (('messages',), ('prompt', 'completion'))
    >>> chat_columns(["text"])
    Traceback (most recent call last):
    ...
    ValueError: The dataset has no 'messages' column and not both 'prompt' and 'completion' (its columns: ['text']); pass column= with the one holding chat messages.
    """
    names = list(column_names)
    if column is not None:
        if column not in names:
            raise ValueError(
                f"The dataset has no column {column!r} (its columns: {names}); pass column= with one of them."
            )
        return (column,)
    if "messages" in names:
        return ("messages",)
    if set(PROMPT_COMPLETION) <= set(names):
        return PROMPT_COMPLETION
    raise ValueError(
        f"The dataset has no 'messages' column and not both 'prompt' and 'completion' (its columns: {names}); "
        "pass column= with the one holding chat messages."
    )


def check_message(message: dict, index: int, column: str, position: int) -> None:
    """Refuse a message without ``role`` or ``content``: rendered, it would be an empty or broken turn.

    A key Arrow filled with None (a column whose rows use different keys) counts as missing; an
    assistant turn with ``tool_calls`` may leave ``content`` None.

    >>> check_message({"role": "user", "text": "hi"}, 3, "messages", 1)
    Traceback (most recent call last):
    ...
    ValueError: Example 3: message 1 of 'messages' has no 'content' (its keys: ['role', 'text']); each message needs 'role' and 'content', e.g. {'role': 'user', 'content': 'hi'}: rename the key (dataset.map) before tokenizing.
    """
    found = [key for key, value in message.items() if value is not None]
    missing = [key for key in ("role", "content") if message.get(key) is None]
    if "content" in missing and message.get("tool_calls") is not None:
        missing.remove("content")
    if missing:
        raise ValueError(
            f"Example {index}: message {position} of {column!r} has no {' and no '.join(map(repr, missing))} "
            f"(its keys: {found}); each message needs 'role' and 'content', e.g. {{'role': 'user', 'content': 'hi'}}: "
            "rename the key (dataset.map) before tokenizing."
        )


def _messages(value: Any, index: int, column: str, default_role: str) -> list[dict]:
    """``value`` as a list of message dicts: a string becomes one turn of ``default_role``."""
    if isinstance(value, str) and default_role:
        return [{"role": default_role, "content": value}]
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, dict) for m in value):
        shown = type(value).__name__ if not isinstance(value, (list, tuple)) else "a list with a non-message item"
        raise TypeError(
            f"Example {index}: {column!r} holds {shown}; it must be {_MESSAGE_SHAPE}"
            f"{' or a string' if default_role else ''}."
        )
    for position, message in enumerate(value):
        check_message(message, index, column, position)
    return list(value)


def conversation_of(values: Sequence[Any], columns: Sequence[str], index: int) -> tuple[list[dict], int]:
    """``(messages, first trained turn)`` of one row, given the values of its chat ``columns``.

    >>> conversation_of(["What is 2 + 2?", "4."], ("prompt", "completion"), index=0)
    ([{'role': 'user', 'content': 'What is 2 + 2?'}, {'role': 'assistant', 'content': '4.'}], 1)
    >>> conversation_of([[]], ("messages",), index=7)
    Traceback (most recent call last):
    ...
    ValueError: Example 7: 'messages' is empty; a conversation needs at least one message (drop the example first).
    """
    if tuple(columns) == PROMPT_COMPLETION:
        prompt = _messages(values[0], index, "prompt", "user")
        completion = _messages(values[1], index, "completion", "assistant")
        messages, first = prompt + completion, len(prompt)
    else:
        messages, first = _messages(values[0], index, columns[0], ""), 0
    if not messages:
        raise ValueError(
            f"Example {index}: {columns[0]!r} is empty; a conversation needs at least one message (drop the example first)."
        )
    return messages, first
