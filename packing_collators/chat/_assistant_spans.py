"""Which tokens of a rendered conversation are the assistant's, so that only they are trained.

A conversation ``[system, user, assistant]`` rendered by a ChatML template (Qwen2's), and its labels::

    <|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nHi?<|im_end|>\\n<|im_start|>assistant\\n Hello.<|im_end|>\\n
    |----- messages[:2] rendered with add_generation_prompt=True: the prompt, labels -100 ---------| |-- trained --|
    |----- messages[:3] rendered: the conversation up to the end of the assistant turn -------------------------|

Two ways to find those tokens, picked by ``assistant_spans``:

- ``"generation"``: the template marks assistant text with ``{% generation %} ... {% endgeneration %}``;
  the trained tokens are exactly those the markers cover (transformers' ``return_assistant_tokens_mask``,
  what TRL's ``assistant_only_loss`` trains).
- ``"prefixes"``: for each trained assistant turn ``k``, ``messages[:k]`` is rendered with the
  generation prompt and ``messages[:k + 1]`` without; the turn is the text the second adds to the
  first: its content, its end-of-turn token and whatever the template writes after it (ChatML's
  newline), so the model learns to stop. Those character spans become tokens through the offsets
  of one tokenization of the whole conversation.
- ``"auto"`` (the default): ``"generation"`` when the template has the markers, else ``"prefixes"``.

Rendering prefixes is exact only for a template that appends: the prompt's text must be a prefix
of the turn's, and the turn's of the whole conversation's, and no token may straddle a boundary
between prompt and answer. A template that rewrites earlier turns (dropping their reasoning, say),
one that never reads ``add_generation_prompt`` (its assistant header cannot be told from the
answer), or a tokenizer that merges text across the boundary (``"### Response: "`` + ``"cat"`` as
``" cat"``) is a ValueError naming the tokenizer, the example and the fix (add the markers).

Cost: one tokenization of each conversation (one batched call to the Rust tokenizer per
``datasets.map`` batch) and its renders: one with markers; with prefixes ``2t`` more for ``t``
assistant turns (``2t - 1`` when it ends with one), each through ``apply_chat_template``'s Python
message handling, about half the time. Against ``apply_chat_template`` alone (input_ids, no labels):
docs/chat.md ("Parallel and batched", measured by ``examples/chat_tokenize.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

__all__ = [
    "AssistantSpans",
    "GENERATION_FIX",
    "assistant_labels",
    "has_generation_markers",
    "render_chats",
    "tokenizer_name",
    "with_full_offsets",
]

AssistantSpans = Literal["auto", "generation", "prefixes"]
GENERATION_FIX = (
    "Mark the assistant text in tokenizer.chat_template with {% generation %} ... {% endgeneration %} "
    "(labels then follow the markers)."
)
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")  # as transformers detects it


def tokenizer_name(tokenizer: Any) -> str:
    """How errors name a tokenizer: its class and ``name_or_path``.

    >>> class Tok: name_or_path = "Qwen/Qwen2.5-0.5B-Instruct"
    >>> tokenizer_name(Tok())
    "Tok('Qwen/Qwen2.5-0.5B-Instruct')"
    """
    return f"{type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '') or 'built in memory'!r})"


def chat_template_of(tokenizer: Any) -> str:
    """The tokenizer's (default) chat template, or a ValueError naming the tokenizer."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template:
        raise ValueError(
            f"The tokenizer {tokenizer_name(tokenizer)} has no chat template; set tokenizer.chat_template "
            "(e.g. from the chat model the data is for) or pass a chat model's tokenizer."
        )
    return template


def has_generation_markers(template: str) -> bool:
    """Whether a chat template marks assistant text with ``{% generation %}``.

    >>> has_generation_markers("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}")
    True
    """
    return bool(_GENERATION.search(template))


def render_chats(tokenizer: Any, conversations: list, indices: Sequence[int], *, generation_prompt: bool) -> list[str]:
    """The conversations rendered as text (one batched call); a template error names its example."""
    if not conversations:
        return []
    try:
        return tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception:  # find which one fails, and say so
        for conversation, index in zip(conversations, indices):
            try:
                tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=generation_prompt)
            except Exception as error:
                raise ValueError(
                    f"The chat template of {tokenizer_name(tokenizer)} fails on example {index} "
                    f"({type(error).__name__}: {' '.join(str(error).split())}); fix the example or the template."
                ) from error
        raise


def _encode(tokenizer: Any, texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """Token ids and character offsets, without special tokens added (as ``apply_chat_template`` tokenizes)."""
    if not texts:
        return [], []
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return encoded["input_ids"], encoded["offset_mapping"]


def _trained_turns(messages: list[dict], first: int) -> list[int]:
    return [k for k in range(first, len(messages)) if messages[k].get("role") == "assistant"]


def _not_appending(tokenizer: Any, index: int, turn: int, what: str) -> ValueError:
    return ValueError(
        f"The chat template of {tokenizer_name(tokenizer)} cannot be split by rendering prefixes: in example "
        f"{index}, {what} (assistant turn at message {turn}). {GENERATION_FIX}"
    )


_STRADDLES = "a token spans the boundary between prompt and answer (the tokenizer merges text across it)"


def _token_range(offsets: np.ndarray, start: int, end: int) -> tuple[int, int] | None:
    """Tokens ``[lo, hi)`` covering characters ``[start, end)``, or None when a token straddles either boundary."""
    lo = int(np.searchsorted(offsets[:, 0], start, "left"))  # first token starting at or after `start`
    hi = int(np.searchsorted(offsets[:, 1], end, "right"))  # tokens ending at or before `end`
    if (lo and offsets[lo - 1, 1] > start) or (hi < len(offsets) and offsets[hi, 0] < end):
        return None
    return lo, hi


_PROMPT_NOT_PREFIX = (
    "the conversation before the turn, rendered with add_generation_prompt=True, is not a prefix of the "
    "conversation up to the end of the turn (the generation prompt differs from the turn's header, or "
    "earlier turns are rewritten)"
)
_TURN_NOT_PREFIX = (
    "the conversation up to the end of the turn is not a prefix of the whole conversation (the template "
    "writes only at the end of a conversation (an eos_token, say), or later turns rewrite it, e.g. drop "
    "its reasoning)"
)


def _check_appends(tokenizer, conversations, turns, prompts, ends, full, indices) -> None:
    """Each rendering must extend the one before: prompt, then the turn's end, then the whole conversation."""
    for j, (i, k) in enumerate(turns):
        for prefix, longer, what in ((prompts[j], ends[j], _PROMPT_NOT_PREFIX), (ends[j], full[i], _TURN_NOT_PREFIX)):
            if not longer.startswith(prefix):
                raise _not_appending(tokenizer, indices[i], k, what)


def _prefix_labels(tokenizer, conversations, firsts, indices, label_pad_id):
    """Input ids and labels from rendering each trained assistant turn's prefixes (module docstring)."""
    if "add_generation_prompt" not in chat_template_of(tokenizer):
        raise ValueError(
            f"The chat template of {tokenizer_name(tokenizer)} never reads add_generation_prompt, so where an "
            f"assistant turn's header ends cannot be found by rendering prefixes. {GENERATION_FIX}"
        )
    _need_offsets(tokenizer)
    turns = []  # (conversation, message index) of each trained assistant turn
    for i, (messages, first) in enumerate(zip(conversations, firsts)):
        for k in _trained_turns(messages, first):
            if k == 0:
                raise ValueError(
                    f"Example {indices[i]} starts with an assistant turn, so it has no prompt to render before it; "
                    "start it with a user (or system) message, or pass it as prompt/completion."
                )
            turns.append((i, k))
    at = [indices[i] for i, _ in turns]
    full = render_chats(tokenizer, list(conversations), indices, generation_prompt=False)
    prompts = render_chats(tokenizer, [conversations[i][:k] for i, k in turns], at, generation_prompt=True)
    inner = [j for j, (i, k) in enumerate(turns) if k < len(conversations[i]) - 1]  # the last turn's end is `full`
    inner_turns = [conversations[turns[j][0]][: turns[j][1] + 1] for j in inner]
    ends = [full[i] for i, _ in turns]
    for j, text in zip(inner, render_chats(tokenizer, inner_turns, [at[j] for j in inner], generation_prompt=False)):
        ends[j] = text
    _check_appends(tokenizer, conversations, turns, prompts, ends, full, indices)
    ids, offsets = _encode(tokenizer, full)
    labels = [[label_pad_id] * len(x) for x in ids]
    arrays = {}
    for j, (i, k) in enumerate(turns):
        if i not in arrays:
            arrays[i] = np.asarray(offsets[i], dtype=np.int64).reshape(-1, 2)
        tokens = _token_range(arrays[i], len(prompts[j]), len(ends[j]))
        if tokens is None:
            raise _not_appending(tokenizer, indices[i], k, _STRADDLES)
        lo, hi = tokens
        labels[i][lo:hi] = ids[i][lo:hi]
    return ids, labels


def _need_offsets(tokenizer: Any) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"The tokenizer {tokenizer_name(tokenizer)} is not a fast tokenizer; finding the assistant's tokens "
            "needs its character offsets. Load it with use_fast=True (AutoTokenizer's default)."
        )


def _untrim(state: Any) -> Any:
    if isinstance(state, dict):
        return {key: False if key == "trim_offsets" else _untrim(value) for key, value in state.items()}
    return [_untrim(value) for value in state] if isinstance(state, list) else state


def with_full_offsets(tokenizer: Any) -> Any:
    """The tokenizer, or a copy whose offsets cover each token's whole text when its post-processor trims them.

    GPT-2-style tokenizers (``ByteLevel(trim_offsets=True)``) leave a token's spaces out of its offsets:
    ``" cat"`` after ``"### Response:"`` would read as starting at ``"c"``, so a token straddling the
    prompt/answer boundary would pass for the answer's. The copy differs only in offsets: with
    ``add_special_tokens=False`` (as chat templates are tokenized) the post-processor adds no token.
    Cost: a check of the post-processor; a trimming tokenizer is copied once per call.
    """
    processor = getattr(getattr(tokenizer, "backend_tokenizer", None), "post_processor", None)
    if processor is None or '"trim_offsets":true' not in processor.__getstate__().decode():
        return tokenizer
    import copy

    untrimmed = copy.copy(processor)
    untrimmed.__setstate__(json.dumps(_untrim(json.loads(processor.__getstate__()))).encode())
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.backend_tokenizer.post_processor = untrimmed
    return tokenizer


def _mask_prompts(tokenizer, conversations, firsts, indices, encodings, masks) -> None:
    """prompt/completion: assistant turns inside the prompt (few-shot) are prompt; mask up to where it ends."""
    cut = [i for i, (m, f) in enumerate(zip(conversations, firsts)) if any(x.get("role") == "assistant" for x in m[:f])]
    at = [indices[i] for i in cut]
    prompts = render_chats(tokenizer, [conversations[i][: firsts[i]] for i in cut], at, generation_prompt=True)
    full = render_chats(tokenizer, [conversations[i] for i in cut], at, generation_prompt=False)
    for i, prompt, text in zip(cut, prompts, full):
        if not text.startswith(prompt):
            what = "the prompt, rendered with add_generation_prompt=True, is not a prefix of the conversation"
            raise _not_appending(tokenizer, indices[i], firsts[i], what)
        offsets = np.asarray(encodings[i].offsets, dtype=np.int64).reshape(-1, 2)
        tokens = _token_range(offsets, len(prompt), len(text))
        if tokens is None:
            raise _not_appending(tokenizer, indices[i], firsts[i], _STRADDLES)
        masks[i][: tokens[0]] = [0] * tokens[0]


def _generation_labels(tokenizer, conversations, firsts, indices, label_pad_id):
    """Input ids and labels from the template's ``{% generation %}`` markers; a prompt's own assistant turns masked."""
    _need_offsets(tokenizer)
    out = tokenizer.apply_chat_template(
        list(conversations), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, masks = out["input_ids"], out["assistant_masks"]
    _mask_prompts(tokenizer, conversations, firsts, indices, out.encodings, masks)
    labels = []
    for i, (token_ids, mask) in enumerate(zip(ids, masks)):
        answered = any(conversations[i][k].get("content") for k in _trained_turns(conversations[i], firsts[i]))
        if answered and not any(mask):
            raise ValueError(
                f"The chat template of {tokenizer_name(tokenizer)} has {{% generation %}} markers, but they cover no "
                f"token of example {indices[i]}, which has assistant turns; check that every assistant turn's text "
                "is inside the markers, or pass assistant_spans='prefixes'."
            )
        labels.append([t if m else label_pad_id for t, m in zip(token_ids, mask)])
    return ids, labels


def assistant_labels(
    tokenizer: Any,
    conversations: Sequence[list[dict]],
    firsts: Sequence[int],
    *,
    indices: Sequence[int],
    assistant_spans: AssistantSpans = "auto",
    label_pad_id: int = -100,
) -> tuple[list[list[int]], list[list[int]]]:
    """``(input_ids, labels)`` of each conversation: labels equal the ids on trained assistant tokens, else ``label_pad_id``.

    ``firsts[i]`` is conversation ``i``'s first trained turn (assistant turns before it are prompt);
    ``indices`` name the conversations in errors.

    >>> from packing_collators.chat._toy_tokenizer import toy_chat_tokenizer
    >>> tokenizer = toy_chat_tokenizer()  # word-level: <|im_start|> 0, <|im_end|> 1, user 2, assistant 3, hi 4, hello 5
    >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    >>> assistant_labels(tokenizer, [chat], [0], indices=[0])
    ([[0, 2, 4, 1, 0, 3, 5, 1]], [[-100, -100, -100, -100, -100, -100, 5, 1]])
    """
    template = chat_template_of(tokenizer)
    tokenizer = with_full_offsets(tokenizer)
    if assistant_spans == "generation" or (assistant_spans == "auto" and has_generation_markers(template)):
        if not has_generation_markers(template):
            raise ValueError(
                f"assistant_spans='generation', but the chat template of {tokenizer_name(tokenizer)} has no "
                f"{{% generation %}} markers. {GENERATION_FIX} Or pass assistant_spans='auto' to render prefixes."
            )
        return _generation_labels(tokenizer, conversations, firsts, indices, label_pad_id)
    return _prefix_labels(tokenizer, conversations, firsts, indices, label_pad_id)
