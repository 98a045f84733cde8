"""The command line on chat data: ``pack --tokenizer`` writes labels that train only the assistant's tokens."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from _chat_fixtures import LLAMA3, QWEN2, QWEN3_LIKE, chat_tokenizer, expected_labels, random_conversation
from datasets import load_from_disk

from packing_collators.cli import main

MAX_LENGTH = 160


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def saved_tokenizer(folder, template: str, name: str) -> str:
    chat_tokenizer(template, name).save_pretrained(str(folder))
    return str(folder)


def segments(packed) -> list[tuple[list[int], list[int]]]:
    """Every packed example's (input_ids, labels), cut out of the rows by seq_lengths."""
    found = []
    for row in packed:
        ends = np.cumsum([0, *row["seq_lengths"]])
        found += [(row["input_ids"][a:b], row["labels"][a:b]) for a, b in zip(ends[:-1], ends[1:])]
    return found


@pytest.mark.parametrize("layout, template", [("qwen2", QWEN2), ("llama3", LLAMA3)])
def test_pack_writes_labels_with_prompts_masked(tmp_path, capsys, layout, template):
    rng = np.random.default_rng(5)
    conversations = [random_conversation(rng) for _ in range(30)]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in conversations])
    folder = saved_tokenizer(tmp_path / "tok", template, layout)
    code = main(["pack", data, str(tmp_path / "out"), "--tokenizer", folder, "--max-length", str(MAX_LENGTH)])
    out, err = capsys.readouterr()
    assert code == 0, err
    packed = load_from_disk(str(tmp_path / "out"))
    assert {"input_ids", "labels", "position_ids", "seq_lengths"} <= set(packed.column_names)
    tokenizer = chat_tokenizer(template, layout)
    expected = {}
    for messages in conversations:
        ids, labels = expected_labels(tokenizer, layout, messages)
        if any(t != -100 for t in labels):  # a conversation ending in an unanswered user turn still has answers
            expected[tuple(ids)] = labels
    found = segments(packed)
    assert len(found) == len(expected) == 30
    for ids, labels in found:
        assert labels == expected[tuple(ids)]  # the first label is a template token, -100 either way
    assert f"{sum(len(ids) for ids in expected):,}" in out


def test_pack_prompt_completion_and_analyze_count_the_same_tokens(tmp_path, capsys):
    rows = [
        {"prompt": "What is two plus four?", "completion": "It is six."},
        {"prompt": "Why?", "completion": "Because the cat sat on a mat."},
    ]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    folder = saved_tokenizer(tmp_path / "tok", QWEN2, "qwen2")
    tokenizer = chat_tokenizer(QWEN2, "qwen2")
    expected = [
        expected_labels(
            tokenizer,
            "qwen2",
            [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}],
            1,
        )
        for r in rows
    ]
    assert main(["pack", data, str(tmp_path / "out"), "--tokenizer", folder, "--max-length", "256", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["packed_tokens"] == sum(len(ids) for ids, _ in expected)
    found = segments(load_from_disk(str(tmp_path / "out")))
    assert sorted((tuple(ids), tuple(labels)) for ids, labels in found) == sorted(
        (tuple(ids), tuple(labels)) for ids, labels in expected
    )
    assert main(["analyze", data, "--tokenizer", folder, "--max-length", "256", "--json"]) == 0
    analysis = json.loads(capsys.readouterr().out)
    assert (analysis["column"], analysis["kind"]) == ("prompt", "prompt_completion")
    assert (analysis["examples"], analysis["tokens"]) == (2, stats["packed_tokens"])


def test_unanswered_conversations_are_left_out_and_logged(tmp_path, capsys, caplog):
    chats = [
        [{"role": "user", "content": "Why?"}],
        [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}],
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in chats])
    folder = saved_tokenizer(tmp_path / "tok", QWEN2, "qwen2")
    with caplog.at_level(logging.WARNING, logger="packing_collators"):
        assert main(["pack", data, str(tmp_path / "out"), "--tokenizer", folder, "--max-length", "64"]) == 0
    assert "2 examples -> 1 kept" in caplog.text and "1 with no trained token dropped" in caplog.text
    assert len(segments(load_from_disk(str(tmp_path / "out")))) == 1


def test_a_template_that_cannot_be_split_is_one_line_naming_it(tmp_path, capsys):
    chat = [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\nBecause."},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": "No."},
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": chat}])
    folder = saved_tokenizer(tmp_path / "tok", QWEN3_LIKE, "qwen3")
    assert main(["pack", data, str(tmp_path / "out"), "--tokenizer", folder, "--max-length", "64"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the progress bar, one line
    assert err.startswith("packing-collators: error: The chat template of ")
    assert f"('{folder}') cannot be split by rendering prefixes: in example 0" in err and "{% generation %}" in err


@pytest.mark.parametrize("command", ["analyze", "pack"])
def test_a_conversation_the_template_fails_on_is_named_by_both_commands(tmp_path, capsys, command):
    """Past the first map batch (1,000 rows), analyze and pack name the same example, in one line."""
    good = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]
    rows = [{"prompt": good[:1], "completion": good[1:]}] * 1500 + [
        {"prompt": good[:1], "completion": [{"role": "assistant", "content": 5}]}  # a number: '...' + 5 fails
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    folder = saved_tokenizer(tmp_path / "tok", QWEN2, "qwen2")
    out = [str(tmp_path / "out")] if command == "pack" else []
    assert main([command, data, *out, "--tokenizer", folder, "--max-length", "64"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"packing-collators: error: The chat template of TokenizersBackend('{folder}') fails on ")
    assert 'example 1500 (TypeError: can only concatenate str (not "int") to str); fix the example' in err
