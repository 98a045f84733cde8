"""Chat test data, shared by the chat, cli and docs tests: two real chat templates (Qwen2.5's ChatML,
Llama 3's with ``{% generation %}`` markers) and kin, a tiny BPE tokenizer carrying them, random
conversations, and the expected labels found from the rendered text's offsets (not by the library).
"""

from __future__ import annotations

import functools

import numpy as np

QWEN2 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3 = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}"
    "{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# How each template writes a turn: (header before the content, end-of-turn text after it, trained for the assistant)
LAYOUT = {
    "qwen2": (lambda role: f"<|im_start|>{role}\n", "<|im_end|>\n"),
    "llama3": (lambda role: f"<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>"),
}
TEMPLATES = {"qwen2": QWEN2, "llama3": LLAMA3}
# Qwen3 drops the reasoning of earlier assistant turns: rendering prefixes cannot split that
QWEN3_LIKE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and not loop.last %}"
    "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- else %}{%- set content = message.content %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# An Alpaca-style template whose generation prompt ends in a space the answer's first token takes
ALPACA_LIKE = (
    "{%- for m in messages %}{%- if m.role == 'user' %}### Instruction: {{ m.content }}\n"
    "{% else %}### Response: {{ m.content }}{{ eos_token }}\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}### Response: {% endif %}"
)
SPECIAL = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]
SPECIAL += ["<|eot_id|>", "</s>"]
WORDS = "the cat sat on a mat and then ran far away what is two plus four it is six yes no why because".split()


@functools.lru_cache
def _bpe_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS), "system user assistant You are Qwen, created by Alibaba Cloud. helpful ###"] * 4
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus, trainer)
    return bpe.to_str()


def chat_tokenizer(template: str, name: str):
    """A byte-level BPE trained here (nothing downloaded) with ``template`` as its chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json()),
        pad_token="<|pad|>",
        bos_token="<|begin_of_text|>",
        eos_token="</s>",
        name_or_path=name,
    )
    tokenizer.chat_template = template
    return tokenizer


def sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, int(rng.integers(1, 12)))).capitalize() + rng.choice([".", "?", "!"])


def random_conversation(rng: np.random.Generator) -> list[dict]:
    """An optional system turn, then 1-4 user/assistant exchanges; sometimes a final user turn."""
    turns = [{"role": "system", "content": sentence(rng)}] if rng.random() < 0.5 else []
    for _ in range(int(rng.integers(1, 5))):
        turns += [{"role": "user", "content": sentence(rng)}, {"role": "assistant", "content": sentence(rng)}]
    if rng.random() < 0.1:
        turns.append({"role": "user", "content": sentence(rng)})
    return turns


def expected_labels(tokenizer, layout: str, messages: list[dict], first_trained: int = 0) -> tuple[list, list]:
    """(input_ids, labels) found from the rendered text's offsets, not by the library."""
    header, end = LAYOUT[layout]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans, cursor = [], 0
    for k, message in enumerate(messages):
        at = text.index(header(message["role"]) + message["content"], cursor) + len(header(message["role"]))
        cursor = at + len(message["content"])
        assert text.startswith(end, cursor), (text, cursor)
        if message["role"] == "assistant" and k >= first_trained:
            spans.append((at, cursor + len(end)))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    inside = [any(s <= a and b <= e for s, e in spans) for a, b in encoded["offset_mapping"]]
    return ids, [t if keep else -100 for t, keep in zip(ids, inside)]
