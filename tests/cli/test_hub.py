"""A Hub name that cannot be downloaded now is said at once (no network is used here: the Hub's answer is stubbed)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from packing_collators.cli import _hub, main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAME = "owner/no-such-model"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An empty Hub cache, offline mode off, and a HEAD request that fails the test if it is made."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_network():
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(_hub, "hub_unreachable", no_network)
    return tmp_path / "hub"


def cache(hub: Path, name: str) -> None:
    (hub / f"models--{name.replace('/', '--')}" / "snapshots" / "abc123").mkdir(parents=True)


@pytest.mark.parametrize("how", ["constant", "variable"])
def test_offline_mode_refuses_an_uncached_name_at_once_naming_it_and_the_fix(hub, monkeypatch, how):
    if how == "constant":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # HF_HUB_OFFLINE=1 before huggingface_hub was imported
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # set since
    with pytest.raises(
        ConnectionError,
        match=r"--tokenizer 'owner/no-such-model' is not a local folder, and HF_HUB_OFFLINE=1 forbids downloading it "
        r".*Pass a folder saved with save_pretrained, or unset HF_HUB_OFFLINE",
    ):
        _hub.hub_load_options(NAME)
    cache(hub, NAME)
    assert _hub.hub_load_options(NAME) == {}  # offline, from the cache: transformers reads it itself


def test_an_unreachable_hub_is_said_at_once_and_a_cached_name_loads_from_the_cache(hub, monkeypatch):
    monkeypatch.setattr(_hub, "hub_unreachable", lambda: "https://huggingface.co does not answer (ConnectError: ...)")
    with pytest.raises(
        ConnectionError, match=r"'owner/no-such-model' is not a local folder, and the Hub cannot be reached"
    ):
        _hub.hub_load_options(NAME, what="--model")
    cache(hub, NAME)
    assert _hub.hub_load_options(NAME) == {"local_files_only": True}


def test_the_command_line_says_it_in_one_line_without_retrying(hub, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    data = tmp_path / "text.jsonl"
    data.write_text('{"text": "hello world"}\n{"text": "a b c"}\n')
    start = time.perf_counter()
    code = main(["analyze", str(data), "--tokenizer", NAME, "--max-length", "8"])
    assert code == 2 and time.perf_counter() - start < 10
    assert (
        "error: --tokenizer 'owner/no-such-model' is not a local folder, and HF_HUB_OFFLINE=1"
        in capsys.readouterr().err
    )


def test_the_examples_say_it_at_once_in_offline_mode(hub, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import offline_data

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConnectionError, match=r"'owner/no-such-model' is not a local folder, and HF_HUB_OFFLINE=1"):
        offline_data.load_model(NAME, tokenizer=None)
    with pytest.raises(ConnectionError, match=r"--model PATH"):
        offline_data.load_tokenizer(NAME)
