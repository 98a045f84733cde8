"""_data_loading: every DATA form opens, columns are picked and checked, text and messages are tokenized right."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict

from packing_collators.cli._input_data import (
    choose_column,
    load_tokenizer,
    open_dataset,
    packable_columns,
    read_lengths,
    token_ids,
)

WORDS = "the cat sat on a mat and then ran far away".split()
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"


def make_tokenizer(folder, *, chat_template: str | None = CHAT_TEMPLATE) -> str:
    """A word-level tokenizer trained here (nothing downloaded), saved like a Hub tokenizer; returns its folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [" ".join(WORDS + ["user", "assistant"])], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"])
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(str(folder))
    return str(folder)


def texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(1, 40)))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


TOKENS = [[1, 2, 3], [4], [5, 6], []]


def test_every_local_form_opens(tmp_path):
    data = Dataset.from_dict({"input_ids": TOKENS, "text": ["a b c", "d", "e f", ""]})
    data.to_parquet(str(tmp_path / "d.parquet"))
    data.to_json(str(tmp_path / "d.jsonl"))
    (tmp_path / "d.json").write_text(json.dumps([{"input_ids": t} for t in TOKENS]))
    pq.write_table(pa.table({"length": [3, 1, 2, 0]}), tmp_path / "lengths.parquet")
    (tmp_path / "d.csv").write_text("length\n3\n1\n2\n0\n")
    data.save_to_disk(str(tmp_path / "disk"))
    DatasetDict({"train": data, "test": data.select([0])}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "files").mkdir()
    data.to_parquet(str(tmp_path / "files" / "part-0.parquet"))
    arrow_file = next((tmp_path / "disk").glob("*.arrow"))
    for name in ("d.parquet", "d.jsonl", "d.json", "disk", "dict", "files", arrow_file.name):
        path = arrow_file if name == arrow_file.name else tmp_path / name
        assert read_lengths(open_dataset(str(path)))[0].tolist() == [3, 1, 2, 0], name
    for name in ("lengths.parquet", "d.csv"):
        assert read_lengths(open_dataset(str(tmp_path / name)), column="length")[0].tolist() == [3, 1, 2, 0]
    assert len(open_dataset(str(tmp_path / "dict"), split="test")) == 1


def test_split_errors(tmp_path):
    data = Dataset.from_dict({"input_ids": TOKENS})
    DatasetDict({"a": data, "b": data}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ValueError, match=r"has several splits \['a', 'b'\] and none is 'train'; pass --split"):
        open_dataset(str(tmp_path / "dict"))
    with pytest.raises(ValueError, match=r"has no split 'train' \(its splits: \['a', 'b'\]\); pass --split"):
        open_dataset(str(tmp_path / "dict"), split="train")


@pytest.mark.parametrize("data", ["missing.parquet", "./missing", "a/b/c", "/abs/missing"])
def test_missing_file_is_not_looked_up_on_the_hub(data):
    with pytest.raises(FileNotFoundError, match=f"DATA '{data}' does not exist: no such file or folder"):
        open_dataset(data)


def test_unknown_file_type(tmp_path):
    (tmp_path / "data.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"DATA '.*data.txt' is not a file type this command reads"):
        open_dataset(str(tmp_path / "data.txt"))


def test_columns_are_picked_and_checked():
    data = Dataset.from_dict(
        {
            "text": ["a"],
            "messages": [[{"role": "user", "content": "a"}]],
            "length": [1],
            "scores": [[0.5]],
            "weight": [0.5],
        }
    )
    assert choose_column(data) == ("messages", "messages"), "input_ids, then messages, then text"
    assert choose_column(data.remove_columns("messages")) == ("text", "text")
    assert choose_column(data, "length") == ("length", "lengths")
    with pytest.raises(ValueError, match=r"The dataset has no column 'input_ids' \(its columns: \['text', "):
        choose_column(data, "input_ids")
    for name in ("scores", "weight"):
        with pytest.raises(TypeError, match=f"Column '{name}' holds .*, not token data: it must hold token ids"):
            choose_column(data, name)
    with pytest.raises(
        ValueError, match=r"has none of the columns \['input_ids', 'messages', 'text'\] .* pass --column"
    ):
        choose_column(data.select_columns(["length"]))


def test_text_and_messages_are_tokenized(tokenizer):
    sample = texts(50)
    conversations = [[{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}] for t in sample]
    data = Dataset.from_dict({"text": sample, "messages": conversations})
    lengths, column, kind = read_lengths(data, column="text", tokenizer=tokenizer)
    assert (column, kind) == ("text", "text")
    assert lengths.tolist() == [len(ids) for ids in tokenizer(sample)["input_ids"]]
    lengths, _, kind = read_lengths(data, tokenizer=tokenizer)
    expected = [len(tokenizer.apply_chat_template(c, tokenize=True, return_dict=False)) for c in conversations]
    assert kind == "messages" and lengths.tolist() == expected
    packed = token_ids(data.remove_columns("messages"), tokenizer=tokenizer)
    assert packed.column_names == ["input_ids"]
    assert packed["input_ids"][:] == tokenizer(sample)["input_ids"]


def test_tokenizing_in_processes_gives_the_same_lengths(tokenizer):
    data = Dataset.from_dict({"text": texts(400, seed=1)})
    one = read_lengths(data, tokenizer=tokenizer, num_proc=1)[0]
    two = read_lengths(data, tokenizer=tokenizer, num_proc=2)[0]
    assert one.tolist() == two.tolist() and one.sum() > 400


def test_tokenizer_errors(tmp_path, tokenizer):
    data = Dataset.from_dict({"text": ["a b"], "messages": [[{"role": "user", "content": "a"}]]})
    with pytest.raises(ValueError, match="Column 'text' holds text; pass --tokenizer NAME_OR_PATH to count its tokens"):
        read_lengths(data, column="text")
    plain = load_tokenizer(make_tokenizer(tmp_path / "plain", chat_template=None))
    with pytest.raises(
        ValueError, match="Column 'messages' holds chat messages, but the tokenizer has no chat template"
    ):
        read_lengths(data, tokenizer=plain)
    with pytest.raises(FileNotFoundError, match="--tokenizer '.*no-tokenizer-here' does not exist: no such folder"):
        load_tokenizer(str(tmp_path / "no-tokenizer-here"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="--tokenizer '.*empty' could not be loaded"):
        load_tokenizer(str(tmp_path / "empty"))


def test_token_ids_for_pack():
    assert token_ids(Dataset.from_dict({"tokens": TOKENS}), column="tokens").column_names == ["input_ids"]
    with pytest.raises(ValueError, match="Column 'length' holds lengths only; packing needs the token ids"):
        token_ids(Dataset.from_dict({"length": [3]}), column="length")
    with pytest.raises(ValueError, match="The dataset has both 'tokens' and 'input_ids'"):
        token_ids(Dataset.from_dict({"tokens": [[1]], "input_ids": [[2]]}), column="tokens")


def test_packable_columns():
    data = Dataset.from_dict({"input_ids": [[1, 2]], "mask": [[1, 1]], "id": [7], "source": ["web"]})
    assert packable_columns(data, keep_columns=["source"], remove_columns=["id"]).column_names == [
        "input_ids",
        "mask",
        "source",
    ]
    with pytest.raises(
        ValueError,
        match=r"Columns \['id'\] are not per-token.* --remove-column NAME .* --keep-column NAME .*PrePackedCollator\(keep_columns=\[NAME\]\)",
    ):
        packable_columns(data, keep_columns=["source"])
    with pytest.raises(ValueError, match=r"The dataset has no column\(s\) \['nope'\]"):
        packable_columns(data, remove_columns=["nope"])
