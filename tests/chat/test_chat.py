"""chat/: labels train exactly the assistant's tokens, on two real chat templates, checked independently.

The two templates are written here as their models ship them (tools left out):
- ``QWEN2``: Qwen2.5's ChatML template, with no ``{% generation %}`` markers and a default system
  prompt, so the assistant spans come from rendering prefixes;
- ``LLAMA3``: Llama 3's template with ``{% generation %}`` markers around each assistant answer
  and its ``<|eot_id|>`` (as TRL's training templates mark them).
The expected labels are derived without the library: the rendered text is searched for each
turn's header and content, and a token is trained when its character offsets lie inside an
assistant answer plus that template's end-of-turn text.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from _chat_fixtures import (  # test data shared with the cli and docs tests
    ALPACA_LIKE,
    LAYOUT,
    LLAMA3,
    QWEN2,
    QWEN3_LIKE,
    TEMPLATES,
    chat_tokenizer,
    expected_labels,
    random_conversation,
)
from datasets import Dataset, DatasetDict
from tokenizers import processors

from packing_collators import ChatStats, tokenize_chat, tokenize_chat_example


@pytest.fixture(scope="module", params=["qwen2", "llama3"])
def layout(request):
    return request.param


@pytest.fixture(scope="module")
def tokenizer(layout):
    return chat_tokenizer(TEMPLATES[layout], f"{layout}-like")


def test_labels_train_exactly_the_assistant_tokens(layout, tokenizer):
    """Random multi-turn conversations: -100 on every system, user and template token, ids on the answers."""
    rng = np.random.default_rng(0)
    conversations = [random_conversation(rng) for _ in range(60)]
    tokenized = tokenize_chat(Dataset.from_dict({"messages": conversations}), tokenizer, drop_untrained=False)
    for i, messages in enumerate(conversations):
        ids, labels = expected_labels(tokenizer, layout, messages)
        assert tokenized[i]["input_ids"] == ids
        assert tokenized[i]["labels"] == labels, i
        trained = [t for t in labels if t != -100]
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        assert tokenizer.decode(trained) == "".join(a + LAYOUT[layout][1] for a in answers)
    assert sum(t == -100 for row in tokenized["labels"] for t in row) > 0


def test_both_ways_of_finding_the_answer_agree_on_the_marked_template():
    """On Llama 3 (markers), rendering prefixes finds the same tokens as the markers."""
    tokenizer = chat_tokenizer(LLAMA3, "llama3-like")
    rng = np.random.default_rng(1)
    for _ in range(20):
        example = {"messages": random_conversation(rng)}
        marked = tokenize_chat_example(example, tokenizer, assistant_spans="generation")
        assert tokenize_chat_example(example, tokenizer, assistant_spans="prefixes") == marked


def test_prompt_completion_trains_the_completion_only(layout, tokenizer):
    """String pairs become a user and an assistant turn; a conversational prompt's own assistant turn is prompt."""
    few_shot = [
        {"role": "user", "content": "What is two plus four?"},
        {"role": "assistant", "content": "It is six."},
        {"role": "user", "content": "Why?"},
    ]
    rows = {
        "prompt": [[{"role": "user", "content": "What is two plus four?"}], few_shot],
        "completion": [[{"role": "assistant", "content": "Six."}], [{"role": "assistant", "content": "Because."}]],
    }
    tokenized = tokenize_chat(Dataset.from_dict(rows), tokenizer)
    assert tokenized.column_names == ["input_ids", "labels"]
    for i in range(2):
        messages = rows["prompt"][i] + rows["completion"][i]
        assert (tokenized[i]["input_ids"], tokenized[i]["labels"]) == expected_labels(
            tokenizer, layout, messages, len(rows["prompt"][i])
        )
    text = tokenize_chat_example({"prompt": "What is two plus four?", "completion": "Six."}, tokenizer)
    assert text == tokenized[0]


def test_num_proc_2_gives_the_same_dataset(tokenizer):
    rng = np.random.default_rng(2)
    data = Dataset.from_dict({"messages": [random_conversation(rng) for _ in range(40)], "id": list(range(40))})
    one = tokenize_chat(data, tokenizer, max_length=64, overflow="truncate")
    two = tokenize_chat(data, tokenizer, max_length=64, overflow="truncate", num_proc=2)
    assert one.to_dict() == two.to_dict() and one.column_names == ["id", "input_ids", "labels"]


def test_overflow_choices_count_what_they_cut(tokenizer, caplog):
    rng = np.random.default_rng(3)
    conversations = [random_conversation(rng) for _ in range(50)]
    data = Dataset.from_dict({"messages": conversations})
    full = tokenize_chat(data, tokenizer)
    lengths = np.array([len(x) for x in full["input_ids"]])
    limit = int(np.percentile(lengths, 70))
    over = np.flatnonzero(lengths > limit)
    with pytest.raises(
        ValueError,
        match=rf"Example {over[0]} has {lengths[over[0]]} tokens, more than max_length={limit} \({len(over)} example",
    ):
        tokenize_chat(data, tokenizer, max_length=limit)

    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        cut, stats = tokenize_chat(data, tokenizer, max_length=limit, overflow="truncate", return_stats=True)
    assert f"truncated {len(over)} ({int((lengths[over] - limit).sum())} tokens cut)" in caplog.text
    # a prompt longer than the limit leaves nothing to train: dropped and counted
    untrained = [i for i in over if all(t == -100 for t in full[int(i)]["labels"][:limit])]
    assert stats.untrained_examples == len(untrained) and stats.kept_examples == 50 - len(untrained)
    kept = [i for i in range(50) if i not in untrained]
    assert cut["input_ids"] == [full[i]["input_ids"][:limit] for i in kept]
    assert cut["labels"] == [full[i]["labels"][:limit] for i in kept]
    assert stats.tokens == sum(min(int(lengths[i]), limit) for i in kept)
    assert stats.trained_tokens == sum(sum(t != -100 for t in row) for row in cut["labels"])

    dropped, stats = tokenize_chat(data, tokenizer, max_length=limit, overflow="drop", return_stats=True)
    assert dropped["input_ids"] == [full[i]["input_ids"] for i in range(50) if lengths[i] <= limit]
    assert (stats.dropped_examples, stats.dropped_tokens) == (len(over), int(lengths[over].sum()))


def test_conversations_without_an_answer_are_dropped_or_kept():
    tokenizer = chat_tokenizer(QWEN2, "qwen2-like")
    chats = [
        [{"role": "user", "content": "Why?"}],
        [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "No."}],
    ]
    data = DatasetDict({"train": Dataset.from_dict({"messages": chats})})
    tokenized, stats = tokenize_chat(data, tokenizer, return_stats=True)
    assert len(tokenized["train"]) == 1 and stats["train"].untrained_examples == 1
    assert isinstance(stats["train"], ChatStats)
    kept = tokenize_chat(data["train"], tokenizer, drop_untrained=False)
    assert len(kept) == 2 and set(kept[0]["labels"]) == {-100}


def test_a_template_that_rewrites_earlier_turns_is_refused_by_name():
    tokenizer = chat_tokenizer(QWEN3_LIKE, "qwen3-like")
    ok = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]
    thinking = ok + [{"role": "user", "content": "And?"}, {"role": "assistant", "content": "No."}]
    thinking[1] = {"role": "assistant", "content": "<think>\nhmm\n</think>\nBecause."}
    data = Dataset.from_dict({"messages": [ok, thinking]})
    with pytest.raises(
        ValueError,
        match=r"chat template of \w+\('qwen3-like'\) cannot be split by rendering prefixes: in "
        r"example 1, the conversation up to the end of the turn is not a prefix of the whole conversation .* "
        r"\{% generation %\}",
    ):
        tokenize_chat(data, tokenizer)


# Phi-3's template ends a conversation with eos_token when add_generation_prompt is off: single-turn fine
PHI3 = (
    "{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)


def test_a_template_that_closes_the_conversation_is_refused_past_one_turn():
    """The end text shows up after every turn rendered alone, not in the whole conversation; the error says so."""
    tokenizer = chat_tokenizer(PHI3, "phi3-like")
    one = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]
    labels = tokenize_chat_example({"messages": one}, tokenizer)["labels"]
    assert tokenizer.decode([t for t in labels if t != -100]) == "Because.<|im_end|>\n</s>"
    with pytest.raises(ValueError, match=r"example 0, .*writes only at the end of a conversation \(an eos_token"):
        tokenize_chat_example({"messages": one + one}, tokenizer)


@pytest.mark.parametrize("trim_offsets", [False, True])
def test_a_tokenizer_that_merges_across_the_boundary_is_refused(trim_offsets):
    """Also when its offsets are trimmed (GPT-2's ByteLevel(trim_offsets=True)): " cat" then reads as starting at "c"."""
    tokenizer = chat_tokenizer(ALPACA_LIKE, "alpaca-like")
    tokenizer.backend_tokenizer.post_processor = processors.ByteLevel(trim_offsets=trim_offsets)
    example = {"messages": [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "cat sat."}]}
    prompt = tokenizer.apply_chat_template(example["messages"][:1], tokenize=False, add_generation_prompt=True)
    assert tokenizer.tokenize(prompt)[-1] == "Ġ" and "Ġcat" in tokenizer.tokenize(prompt + "cat sat.")
    with pytest.raises(
        ValueError,
        match=r"'alpaca-like'.* example 0, a token spans the boundary between prompt and answer \(the tokenizer merges",
    ):
        tokenize_chat_example(example, tokenizer)
    with pytest.raises(ValueError, match="a token spans the boundary"):
        tokenize_chat(Dataset.from_dict({"messages": [example["messages"]]}), tokenizer)
    assert tokenizer.backend_tokenizer.post_processor.trim_offsets == trim_offsets  # the caller's tokenizer as it was


@pytest.mark.parametrize(
    "template, options, message",
    [
        ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", {}, "never reads add_generation_prompt"),
        (QWEN2, {"assistant_spans": "generation"}, r"has no \{% generation %\} markers"),
        (None, {}, "has no chat template; set tokenizer.chat_template"),
        (
            LLAMA3.replace("message['role'] == 'assistant'", "message['role'] == 'bot'"),
            {},
            "cover no token of example 0",
        ),
    ],
)
def test_templates_it_cannot_use_are_errors_naming_the_tokenizer(template, options, message):
    tokenizer = chat_tokenizer(template, "odd-template")
    example = {"messages": [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]}
    with pytest.raises(ValueError, match=message) as error:
        tokenize_chat_example(example, tokenizer, **options)
    assert "odd-template" in str(error.value)


def test_bad_rows_and_datasets_are_errors_naming_the_example(tokenizer):
    answer_first = [{"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Why?"}]
    if tokenizer.chat_template == QWEN2:
        with pytest.raises(ValueError, match="Example 3 starts with an assistant turn"):
            tokenize_chat_example({"messages": answer_first}, tokenizer, index=3)
    with pytest.raises(TypeError, match="Example 0: 'messages' holds str; it must be a list of"):
        tokenize_chat_example({"messages": "hello"}, tokenizer)
    with pytest.raises(ValueError, match=r"already has \['input_ids'\], which tokenize_chat writes"):
        tokenize_chat(Dataset.from_dict({"messages": [answer_first], "input_ids": [[1]]}), tokenizer)
    with pytest.raises(ValueError, match=r"no 'messages' column and not both 'prompt' and 'completion'"):
        tokenize_chat(Dataset.from_dict({"prompt": ["Why?"]}), tokenizer)
    with pytest.raises(TypeError, match="takes a datasets.Dataset or DatasetDict, got list"):
        tokenize_chat([{"messages": answer_first}], tokenizer)
    with pytest.raises(ValueError, match="overflow='cut' is not supported"):
        tokenize_chat(Dataset.from_dict({"messages": [answer_first]}), tokenizer, overflow="cut")


def test_importing_the_package_loads_neither_transformers_nor_torch():
    """tokenize_chat is public, yet `import packing_collators` stays light: the tokenizer comes in from outside."""
    import subprocess
    import sys

    code = "import sys, packing_collators; print(sorted({'torch', 'transformers', 'datasets'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_a_new_library_version_does_not_reuse_an_old_tokenization_cache(tokenizer, monkeypatch):
    # datasets keys Dataset.map's cache on the hash of the map function; a labelling fix in a new release
    # must not be served from the old release's cache
    from datasets.fingerprint import Hasher

    from packing_collators import _version
    from packing_collators.chat._options import ChatOptions
    from packing_collators.chat._tokenize import _ChatBatch

    def key():
        return Hasher.hash(_ChatBatch(tokenizer, ["messages"], ChatOptions()))

    assert key() == key()
    before = key()
    monkeypatch.setattr(_version, "__version__", "999.0")
    assert key() != before


def test_options_are_one_frozen_object_checked_at_construction():
    import dataclasses

    from packing_collators.chat._options import ChatOptions

    options = ChatOptions(max_length=8, overflow="truncate", label_pad_id=-1.0, num_proc=1)
    assert (options.truncates, options.label_pad_id, options.map_processes) == (True, -1, None)
    assert ChatOptions(num_proc=4).map_processes == 4 and not ChatOptions(max_length=8).truncates
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_length = 4
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        ChatOptions(max_length=0)
    with pytest.raises(ValueError, match="assistant_spans='markers' is not supported"):
        ChatOptions(assistant_spans="markers")
