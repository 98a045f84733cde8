"""Malformed chat messages and empty datasets: refused by name, or an empty result with a warning.

A message without ``content`` (``{"role": "user", "text": ...}``) would render an empty turn and train
on it silently; one without ``role`` would break the template. Both are refused, naming the example,
the message, the keys found and the keys expected, in ``tokenize_chat`` and in the command line.
"""

from __future__ import annotations

import json
import logging

import pytest
from _chat_fixtures import QWEN2, chat_tokenizer
from datasets import Dataset, DatasetDict

from packing_collators import tokenize_chat, tokenize_chat_example
from packing_collators.chat._conversations import check_message
from packing_collators.cli import main

GOOD = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]
TEXT_KEY = [{"role": "user", "text": "Why?"}, {"role": "assistant", "text": "Because."}]


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer(QWEN2, "qwen2")


def test_a_message_without_content_is_refused_naming_row_keys_and_expected_key(tokenizer):
    mixed = Dataset.from_dict({"messages": [GOOD, GOOD, TEXT_KEY]})  # Arrow fills the missing keys with None
    with pytest.raises(
        ValueError,
        match=r"Example 2: message 0 of 'messages' has no 'content' \(its keys: \['role', 'text'\]\); "
        r"each message needs 'role' and 'content'",
    ):
        tokenize_chat(mixed, tokenizer)
    only_text = r"Example 0: message 0 of 'messages' has no 'content' \(its keys: \['role', 'text'\]\)"
    with pytest.raises(ValueError, match=only_text):
        tokenize_chat(Dataset.from_dict({"messages": [TEXT_KEY]}), tokenizer)
    with pytest.raises(ValueError, match=r"Example 4: message 0 of 'completion' has no 'content'"):
        completion = [{"role": "assistant", "value": "x"}]
        tokenize_chat_example({"prompt": "Why?", "completion": completion}, tokenizer, index=4)


def test_a_message_without_role_is_refused(tokenizer):
    no_role = [{"content": "Why?"}, {"role": "assistant", "content": "Because."}]
    no_role_error = r"Example 0: message 0 of 'messages' has no 'role' \(its keys: \['content'\]\)"
    with pytest.raises(ValueError, match=no_role_error):
        tokenize_chat_example({"messages": no_role}, tokenizer)
    with pytest.raises(ValueError, match=r"has no 'role' and no 'content' \(its keys: \['from', 'value'\]\)"):
        tokenize_chat_example({"messages": [{"from": "human", "value": "hi"}]}, tokenizer)


def test_a_tool_call_turn_may_leave_content_empty():
    check_message({"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]}, 0, "messages", 2)
    with pytest.raises(ValueError, match="message 2 of 'messages' has no 'content'"):
        check_message({"role": "assistant", "content": None}, 0, "messages", 2)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize("command", ["pack", "analyze"])
@pytest.mark.parametrize(
    "rows, expected",
    [
        ([TEXT_KEY], "holds messages with no 'content'"),  # every message: Arrow has no content field
        ([GOOD, TEXT_KEY], "Example 1: message 0 of 'messages' has no 'content'"),  # datasets loads them as Json
    ],
)
def test_the_command_line_refuses_them_in_one_line(tmp_path, capsys, tokenizer, command, rows, expected):
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in rows])
    out = [str(tmp_path / "out")] if command == "pack" else []
    code = main([command, data, *out, "--tokenizer", str(tmp_path / "tok"), "--max-length", "64"])
    line = capsys.readouterr().err.strip().splitlines()[-1]  # after datasets' progress bar, if any
    assert code == 2
    assert line.startswith("packing-collators: error: ") and expected in line and "'text'" in line
    assert not (tmp_path / "out").exists()


def test_an_empty_dataset_gives_an_empty_result_and_a_warning(tokenizer, caplog):
    empty = Dataset.from_dict({"messages": [GOOD], "source": ["a"]}).select([])
    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        tokenized, stats = tokenize_chat(empty, tokenizer, max_length=16, return_stats=True)
    assert len(tokenized) == 0 and tokenized.column_names == ["source", "input_ids", "labels"]
    full = tokenize_chat(Dataset.from_dict({"messages": [GOOD], "source": ["a"]}), tokenizer)
    assert tokenized.features == full.features  # concatenable with a non-empty split
    assert (stats.examples, stats.kept_examples, stats.tokens) == (0, 0, 0)
    assert "the dataset has no examples, so the result is empty" in caplog.text
    splits = tokenize_chat(DatasetDict({"train": Dataset.from_dict({"messages": [GOOD]}), "test": empty}), tokenizer)
    assert (len(splits["train"]), len(splits["test"])) == (1, 0)
    assert len(tokenize_chat(Dataset.from_dict({"messages": []}), tokenizer)) == 0  # no rows, no types at all
