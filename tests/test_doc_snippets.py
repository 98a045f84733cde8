"""Every ```python block of README.md and docs/*.md runs as written.

One test per file (README.md, then every docs/*.md, found by glob, so a new page is picked up):
its blocks run in order, in one namespace, in a fresh working directory. A block of ``>>>``
examples runs through doctest in that same namespace (its output is checked), so the names it
defines are there for the blocks after it; any other block is executed as a script. ```bash
blocks and output blocks are not run. This is the one place the pages run (pytest collects no
markdown: pyproject.toml's ``testpaths``).

What the pages load is prepared in the working directory first, each built here, nothing
downloaded (:func:`prepare_fixtures`):

    Qwen/Qwen2.5-0.5B-Instruct/   a tiny random Qwen2 and a byte-level BPE chat tokenizer saved at
                                  the Hub name the pages load, so from_pretrained finds them locally
    my_tokenized_sft/             16 tokenized examples (input_ids, labels), save_to_disk
    packed/shard-0000{0,1}.parquet  the two shards the sharded-build recipe writes (by the CLI)
    chats.jsonl, huge.jsonl       conversations ("messages") and text, the files the pages open

Cost: the fixtures take about 8 s once; then under 2 s per page on 2 CPU cores, but trl.md's two
SFTTrainer runs (about 10 s, marked ``slow``; ``make test`` runs it).
"""

from __future__ import annotations

import doctest
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HUB_NAME = "Qwen/Qwen2.5-0.5B-Instruct"  # the model and tokenizer name the pages use
FENCE = re.compile(r"^```(\w*)\s*$")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, source)`` of every ```python block, in order.

    >>> python_blocks("x\\n```python\\na = 1\\n```\\n```bash\\nls\\n```\\n")
    [(3, 'a = 1\\n')]
    """
    blocks, language, start, lines = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line.strip()) if line.startswith("```") else None
        if language is None and match:
            language, start, lines = match.group(1), number + 1, []
        elif language is not None and line.strip() == "```":
            if language == "python":
                blocks.append((start, "".join(f"{x}\n" for x in lines)))
            language = None
        elif language is not None:
            lines.append(line)
    return blocks


def run_block(source: str, namespace: dict, where: str) -> None:
    """Run one block in ``namespace``: as doctest examples if it has ``>>>``, else as a script."""
    if not any(line.lstrip().startswith(">>>") for line in source.splitlines()):
        exec(compile(source, where, "exec"), namespace)
        return
    test = doctest.DocTestParser().get_doctest(source, namespace, where, where, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    failures = []
    runner.run(test, out=failures.append, clear_globs=False)
    namespace.update(test.globs)  # a DocTest runs in a copy of the globals it is given
    assert runner.failures == 0, "".join(failures)


def _tokenizer():
    from _chat_fixtures import QWEN2, chat_tokenizer

    return chat_tokenizer(QWEN2, HUB_NAME)


def prepare_fixtures(directory: Path) -> None:
    """Write what the pages load into ``directory`` (see the module docstring)."""
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Qwen2Config

    from packing_collators.cli import main

    tokenizer = _tokenizer()
    tokenizer.save_pretrained(directory / HUB_NAME)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory / HUB_NAME)

    rng = np.random.default_rng(0)
    ids = [rng.integers(8, len(tokenizer), int(n)).tolist() for n in rng.integers(8, 64, 16)]
    labels = [[-100] * (len(x) // 2) + x[len(x) // 2 :] for x in ids]  # a prompt half masked
    Dataset.from_dict({"input_ids": ids, "labels": labels}).save_to_disk(str(directory / "my_tokenized_sft"))
    for index in range(2):
        shard = directory / "packed" / f"shard-{index:05d}.parquet"
        argv = ["pack", str(directory / "my_tokenized_sft"), str(shard), "--max-length", "2048"]
        assert main([*argv, "--num-shards", "2", "--shard-index", str(index)]) == 0

    chat = [{"role": "user", "content": "what is two plus four"}, {"role": "assistant", "content": "it is six"}]
    (directory / "chats.jsonl").write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(4)))
    text = ["the cat sat on a mat", "why because the cat ran far away"] * 4
    (directory / "huge.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in text))


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("doc_fixtures")
    prepare_fixtures(directory)
    return directory


def test_every_page_is_collected():
    names = [page.name for page in PAGES]
    assert names[0] == "README.md" and {"index.md", "trainer.md", "chat.md"} <= set(names)


SLOW_PAGES = {"trl.md"}  # trains twice through SFTTrainer: about 10 s on 2 cores


@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=[pytest.mark.slow] if page.name in SLOW_PAGES else []) for page in PAGES],
    ids=[page.name for page in PAGES],
)
def test_python_blocks_run_as_written(page, fixtures, tmp_path, monkeypatch, capsys):
    import shutil

    shutil.copytree(fixtures, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the Hub name resolves to the local copy, never a download
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    namespace = {"__name__": "__doc_snippets__"}
    relative = page.relative_to(ROOT)
    for line, source in python_blocks(page.read_text()):
        run_block(source, namespace, f"{relative}:{line}")
