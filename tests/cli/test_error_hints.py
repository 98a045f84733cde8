"""Errors say the fix in the caller's own terms: the command line's options, the Trainer's setting.

- The command line surfaces library errors, rewritten at its boundary: ``overflow='split'`` reads
  ``--overflow split`` (``packing_collators/cli/_messages.py``); every fix it names works as written.
- Pre-packed rows through a Trainer that drops unused columns name ``remove_unused_columns=False``.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _chat_fixtures import QWEN2, chat_tokenizer
from _tiny_models import random_examples, tiny_model, training_args
from datasets import Dataset

from packing_collators import PackingTrainer, PrePackedCollator, pack_dataset
from packing_collators.cli import main

PYTHON_SYNTAX = re.compile(r"\b\w+=['\"\[\d]|remove_columns\(|\bmax_length\b|\bnum_shards\b|\bshard_index\b|keep_columns")


def run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


def write_tokens(path, **columns) -> str:
    pq.write_table(pa.table(columns), str(path))
    return str(path)


@pytest.mark.parametrize(
    "extra, expected",
    [
        ([], "more than --max-length 8 (1 example(s) too long, the longest 12 tokens). Pass --overflow split (keep"),
        (
            ["--overflow", "truncate", "--num-shards", 2, "--shard-index", 3],
            "--shard-index 3 is out of range for --num-shards 2",
        ),
        (["--overflow", "truncate", "--keep-column", "input_ids"], "--keep-column cannot name 'input_ids'"),
    ],
)
def test_pack_errors_name_the_options_of_the_command_line(tmp_path, capsys, extra, expected):
    data = write_tokens(tmp_path / "t.parquet", input_ids=[[1, 2, 3], list(range(1, 13))])
    code, err = run(capsys, "pack", data, tmp_path / "out", "--max-length", 8, *extra)
    assert code == 2 and err.startswith("packing-collators: error: ") and expected in err
    assert not PYTHON_SYNTAX.search(err), err


def test_the_remove_column_a_message_names_works_as_written(tmp_path, capsys):
    data = write_tokens(tmp_path / "t.parquet", input_ids=[[1, 2, 3]], seq_lengths=[[3]])
    code, err = run(capsys, "pack", data, tmp_path / "out", "--max-length", 8)
    assert code == 2 and "(--remove-column seq_lengths)" in err and not PYTHON_SYNTAX.search(err), err
    assert run(capsys, "pack", data, tmp_path / "out", "--max-length", 8, "--remove-column", "seq_lengths")[0] == 0

    chat = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": chat, "labels": [1]}) + "\n")
    chat_tokenizer(QWEN2, "qwen2").save_pretrained(str(tmp_path / "tok"))
    argv = ("pack", tmp_path / "chat.jsonl", tmp_path / "chat_out", "--tokenizer", tmp_path / "tok", "--max-length", 64)
    code, err = run(capsys, *argv)
    assert code == 2 and "remove them first (--remove-column labels)" in err and not PYTHON_SYNTAX.search(err), err
    assert run(capsys, *argv, "--remove-column", "labels")[0] == 0  # removed before tokenizing, as it says


def test_prepacked_rows_through_a_column_dropping_trainer_name_the_fix(tmp_path):
    from transformers import Trainer

    packed = pack_dataset(Dataset.from_list(random_examples([5, 7, 3, 9], seed=1)), max_length=16)
    trainer = Trainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=1),  # remove_unused_columns=True, the default
        train_dataset=packed,
        data_collator=PrePackedCollator(),
    )
    assert trainer.args.remove_unused_columns
    with pytest.raises(ValueError, match=r"has no 'seq_lengths'.*remove_unused_columns=False.*PackingTrainer"):
        trainer.train()
    kept = PackingTrainer(  # keeps seq_lengths by itself
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=1),
        train_dataset=packed,
        data_collator=PrePackedCollator(),
        packing_probe=False,
    )
    kept.train()
    assert kept.state.global_step == 1
