"""Chat and instruction data: conversations in, ``input_ids`` and assistant-only ``labels`` out.

    _conversations.py    a row (messages, or prompt/completion) -> messages and the first trained turn
    _assistant_spans.py  which tokens are the assistant's: {% generation %} markers, or rendered prefixes
    _stats.py            ChatStats: examples and tokens kept, trained, truncated, dropped
    _options.py          ChatOptions: tokenize_chat's options, one frozen object validated when built
    _tokenize.py         tokenize_chat (a datasets Dataset, batched, parallel) and tokenize_chat_example
    _toy_tokenizer.py    a word-level chat tokenizer built in place, for the docstrings' examples

Built on the engine's overflow vocabulary (and offline packing's wording of a max_length error);
transformers and datasets are used through the objects passed in (a tokenizer, a dataset), so
importing this folder loads neither.
"""

from ._assistant_spans import (
    AssistantSpans,
    assistant_labels,
    has_generation_markers,
    render_chats,
    tokenizer_name,
)
from ._conversations import PROMPT_COMPLETION, chat_columns, conversation_of
from ._stats import ChatStats
from ._tokenize import tokenize_chat, tokenize_chat_example

__all__ = [
    "AssistantSpans",
    "ChatStats",
    "PROMPT_COMPLETION",
    "assistant_labels",
    "chat_columns",
    "conversation_of",
    "has_generation_markers",
    "render_chats",
    "tokenize_chat",
    "tokenize_chat_example",
    "tokenizer_name",
]
