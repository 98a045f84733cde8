"""A tiny word-level chat tokenizer built in place (nothing downloaded), for the examples in this folder's docstrings.

    words      <|im_start|>  <|im_end|>  user  assistant  hi  hello  ?    (any other word is ?)
    ids        0             1           2     3          4   5      6

Its chat template writes ``<|im_start|>{role} {content}<|im_end|>`` per message and
``<|im_start|>assistant `` as the generation prompt (ChatML without newlines). Cost: milliseconds.
"""

from __future__ import annotations

__all__ = ["toy_chat_tokenizer"]

WORDS = ["<|im_start|>", "<|im_end|>", "user", "assistant", "hi", "hello", "?"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def toy_chat_tokenizer():
    """A ``PreTrainedTokenizerFast`` of :data:`WORDS` with the chat template :data:`TEMPLATE`.

    >>> tokenizer = toy_chat_tokenizer()
    >>> tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    '<|im_start|>user hi<|im_end|>'
    >>> tokenizer("<|im_start|>user hi<|im_end|>")["input_ids"]
    [0, 2, 4, 1]
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, extra_special_tokens=WORDS[:2])
    tokenizer.chat_template = TEMPLATE
    return tokenizer
