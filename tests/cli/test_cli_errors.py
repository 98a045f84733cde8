"""Unreadable or empty DATA files: one line on stderr and exit code 2, from analyze and pack alike, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packing_collators.cli import main

COMMANDS = ["analyze", "pack"]


def run(capfd, command: str, data: Path, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    """Run one command on ``data``; stdout and stderr as the process would write them (file descriptors too)."""
    capfd.readouterr()
    out_path = [str(tmp_path / "packed")] if command == "pack" else []
    code = main([command, str(data), *out_path, "--max-length", "8", *extra])
    out, err = capfd.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, message: str) -> None:
    assert code == 2, err
    assert err.startswith("packing-collators: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_a_line_that_is_not_json_is_named(capfd, tmp_path, command):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"input_ids": [1, 2]}\n\n{"input_ids": [3]}\nnot json\n{"input_ids": [4]}\n')
    code, out, err = run(capfd, command, data, tmp_path)
    assert_one_line_error(code, out, err, f"DATA '{data}' is not valid JSON lines: line 4 is not a JSON object (")
    assert "'not json'" in err and 'each line must be one JSON object, e.g. {"input_ids": [1, 2, 3]}' in err
    assert not (tmp_path / "packed").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_truncated_json_line_is_named(capfd, tmp_path, command):
    data = tmp_path / "cut.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [1] * 3}) + "\n" for _ in range(5)) + '{"input_ids": [1, 2')
    code, out, err = run(capfd, command, data, tmp_path)
    assert_one_line_error(code, out, err, "line 6 is not a JSON object")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["empty", "blank-lines"])
def test_an_empty_jsonl_file_has_no_examples(capfd, tmp_path, command, content):
    data = tmp_path / "empty.jsonl"
    data.write_text(content)
    code, out, err = run(capfd, command, data, tmp_path)
    assert_one_line_error(code, out, err, f"DATA '{data}' has no examples: the file is empty")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name, content", [("header.csv", "input_ids,length\n"), ("array.json", "[]")])
def test_a_file_of_no_rows_has_no_examples(capfd, tmp_path, command, name, content):
    data = tmp_path / name
    data.write_text(content)
    code, out, err = run(capfd, command, data, tmp_path)
    assert_one_line_error(code, out, err, f"DATA '{data}' has no examples")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_parquet_file_of_no_rows_has_no_examples(capfd, tmp_path, command):
    data = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([], pa.list_(pa.int64()))}), data)
    code, out, err = run(capfd, command, data, tmp_path)
    assert_one_line_error(code, out, err, f"DATA '{data}' has no examples")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_malformed_csv_file_is_one_line(capfd, tmp_path, command):
    data = tmp_path / "bad.csv"
    data.write_text('input_ids,source\n1,web\n"2,math\n')
    code, out, err = run(capfd, command, data, tmp_path)
    assert_one_line_error(code, out, err, f"DATA '{data}' could not be read as CSV (")


def test_a_malformed_json_document_is_one_line(capfd, tmp_path):
    data = tmp_path / "bad.json"
    data.write_text('[{"input_ids": [1, 2]}, {"input_ids": [3]')
    code, out, err = run(capfd, "analyze", data, tmp_path)
    assert_one_line_error(code, out, err, f"DATA '{data}' could not be read as JSON (")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_good_jsonl_file_still_works(capfd, tmp_path, command):
    data = tmp_path / "good.jsonl"
    data.write_text("".join(json.dumps({"input_ids": list(range(1, n + 1))}) + "\n" for n in (3, 5, 2, 6)))
    code, out, err = run(capfd, command, data, tmp_path, "--json")
    assert code == 0, err
    assert json.loads(out)["examples"] == 4


def test_pack_refuses_a_negative_token_id(capfd, tmp_path):
    data = tmp_path / "neg.jsonl"
    data.write_text('{"input_ids": [1, 2]}\n{"input_ids": [3, -100, 4]}\n')
    code, out, err = run(capfd, "pack", data, tmp_path)
    assert_one_line_error(code, out, err, "Example 1: input_ids[1] = -100 is negative")
