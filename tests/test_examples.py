"""The example scripts, run end to end on the offline defaults (tiny random Llama, python-docs).

Each script runs as a subprocess for one epoch over a few examples; its printed summary is
parsed and checked against the dataset, tokenized here independently with the same helpers:
every example and token trained exactly once (plus the sampler's declared repeats), padding
avoided = padded equivalent - slots computed, a finite loss. The first call builds the
python-docs dataset and tokenizer into ``examples/.cache`` (about 20 s), later ones reuse it.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import _preloaded as preloaded
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = [
    "demo.py",
    "sft_flattening.py",
    "sft_prepacked.py",
    "sft_packing_trainer.py",
    "sft_multipack.py",
    "chat_tokenize.py",
    "sft_trl.py",
    "sft_vlm.py",
    "dpo_packing.py",
    "grpo.py",
]
TINY = ["--max-examples", "24", "--batch-size", "4", "--max-length", "96", "--logging-steps", "1"]

sys.path.insert(0, str(EXAMPLES))
import offline_data  # noqa: E402


def sft_dataset(names, max_examples, max_length, tokenizer):
    """The examples' dataset, tokenized as every script tokenizes it (assistant-only labels, truncated)."""
    from packing_collators import tokenize_chat

    conversations = offline_data.load_conversations(names, "train", max_examples)
    chat = ["messages"] if "messages" in conversations.column_names else ["prompt", "completion"]
    return tokenize_chat(conversations.select_columns(chat), tokenizer, max_length=max_length, overflow="truncate")


def run(*command: str, timeout: int = 300) -> str:
    """Run ``command`` from the repository root (offline, one thread); its stdout. A Python script (or ``-c``)
    runs forked with torch already imported (``_preloaded.py``), as ``python script`` would run it."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }  # tiny models: a second thread only adds contention
    if command[0] == sys.executable and command[1] != "-m":
        code, stdout, stderr = preloaded.run(list(command[1:]), env=env, cwd=ROOT, timeout=timeout)
    else:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    assert code == 0, f"{command} failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    return stdout


def number(text: str) -> float:
    """The first number in ``text`` ('1,234', '56.7%' -> 0.567)."""
    match = re.search(r"-?[\d,]*\.?\d+(%?)", text)
    assert match, f"no number in {text!r}"
    value = float(match.group(0).rstrip("%").replace(",", ""))
    return value / 100 if match.group(1) else value


def summary(stdout: str) -> dict[str, str]:
    """The ``key: value`` lines after the ``== title ==`` line."""
    assert "\n== " in stdout, f"no summary in:\n{stdout[-3000:]}"
    lines = stdout.rsplit("\n== ", 1)[1].splitlines()[1:]
    return dict(line.split(":", 1) for line in lines if ":" in line)


@pytest.fixture(scope="module")
def dataset():
    """The script's dataset under TINY settings: (examples, tokens, trained labels)."""

    tokenized = sft_dataset(offline_data.OFFLINE_DATASET, 24, 96, offline_data.load_tokenizer(offline_data.OFFLINE_MODEL))
    tokens = sum(len(ids) for ids in tokenized["input_ids"])
    trained = sum(sum(t != -100 for t in labels[1:]) for labels in tokenized["labels"])
    return len(tokenized), tokens, trained


def check_summary(s: dict[str, str], dataset, *, repeated_tokens: int = 0, repeated_examples: int = 0) -> None:
    examples, tokens, trained = dataset
    assert s["dataset"].strip() == f"{examples:,} examples, {tokens:,} tokens"
    assert number(s["examples"]) == examples + repeated_examples
    assert number(s["tokens"]) == tokens + repeated_tokens
    if not repeated_tokens:
        assert number(s["trained tokens"]) == trained  # each example's first label is masked, a prompt token
    padded, slots = number(s["padded equivalent"]), number(s["packing efficiency"].split(" in ")[1])
    assert padded > slots >= number(s["tokens"])
    assert number(s["padding waste avoided"]) == padded - slots
    assert 0 < number(s["packing efficiency"]) <= 1
    assert math.isfinite(number(s["final loss"])) and 0 < number(s["final loss"]) < 20
    assert number(s["tokens/s"]) > 0


def test_each_script_needs_nothing_beside_it_but_the_offline_data_helper():
    """A script copied with offline_data.py runs: it imports no other file of examples/."""
    import ast

    local = {path.stem for path in EXAMPLES.glob("*.py")}
    for name in SCRIPTS:
        tree = ast.parse((EXAMPLES / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert imported & local <= {"offline_data"}, (name, imported & local)
    assert len((EXAMPLES / "offline_data.py").read_text().splitlines()) <= 175  # with hub_options: a Hub name out of reach said at once


@pytest.mark.slow
def test_every_script_has_help():
    code = "; ".join(
        f"sys.argv = ['{name}', '--help']; exec(\"try: runpy.run_path('{EXAMPLES / name}', run_name='__main__')\\n"
        f'except SystemExit as e: assert e.code == 0, e")'
        for name in SCRIPTS
    )
    out = run(sys.executable, "-c", f"import runpy, sys; sys.path.insert(0, '{EXAMPLES}'); {code}")
    for name in SCRIPTS:
        assert f"usage: {name}" in out
    assert out.count("--dataset") >= len(SCRIPTS) - 1 and out.count("--model") >= len(SCRIPTS)  # sft_vlm: synthetic


def test_local_files_prompt_completion_and_messages(tmp_path):
    """--dataset with local jsonl/parquet files; prompts masked, every answer and its end token trained."""
    import datasets

    rows = [{"prompt": "What is 2 + 2?", "completion": "It is 4."}]
    datasets.Dataset.from_list(rows).to_json(tmp_path / "a.jsonl")
    chats = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi?"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "And?"},
                {"role": "assistant", "content": "Bye."},
            ],
            "source": "chat",
        }
    ]
    datasets.Dataset.from_list(chats).to_parquet(tmp_path / "b.parquet")
    tokenizer = offline_data.load_tokenizer(offline_data.OFFLINE_MODEL)
    for path, answers in ((tmp_path / "a.jsonl", ["It is 4."]), (tmp_path / "b.parquet", ["Hello.", "Bye."])):
        tokenized = sft_dataset([str(path)], None, 512, tokenizer)
        assert tokenized.column_names == ["input_ids", "labels"]
        example = tokenized[0]
        trained = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
        assert tokenizer.decode(trained) == "".join(answer + "<|im_end|>\n" for answer in answers)
        assert tokenizer.decode(example["input_ids"]).endswith("<|im_start|>assistant\n" + answers[-1] + "<|im_end|>\n")
    with pytest.raises(ValueError, match="needs 'messages'"):
        datasets.Dataset.from_list([{"text": "x"}]).to_json(tmp_path / "c.jsonl")
        offline_data.load_conversations([str(tmp_path / "c.jsonl")])


@pytest.mark.slow
@pytest.mark.parametrize("script", ["sft_flattening.py", "sft_prepacked.py", "sft_packing_trainer.py"])
def test_trainer_scripts_train_every_example_once(script, dataset):
    s = summary(run(sys.executable, f"examples/{script}", *TINY))
    check_summary(s, dataset)
    steps = number(s["optimizer steps"])
    assert steps == number(s["micro-batches"])
    if script == "sft_flattening.py":  # online flattening keeps the padded run's steps
        assert steps == math.ceil(dataset[0] / 4)
    if script == "sft_prepacked.py":
        rows = number(s["packed rows"])
        assert steps == math.ceil(rows / 2) and rows * 96 >= dataset[1]


@pytest.mark.slow
@pytest.mark.distributed
def test_multipack_loop_on_two_processes(dataset):
    """torchrun with 2 CPU processes (gloo): the sampler's plan is trained exactly, repeats included."""
    out = run(
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "examples/sft_multipack.py", *TINY
    )
    s = summary(out)
    assert "(2 process(es))" in out
    repeated = int(number(s["planned tokens"].split("(")[1]))
    planned = number(s["planned tokens"])
    check_summary(s, dataset, repeated_tokens=planned - dataset[1], repeated_examples=repeated)
    assert number(s["micro-batches"]) == 2 * number(s["optimizer steps"]) == 2 * number(s["sampler plan"])


@pytest.mark.slow
def test_demo_padded_and_packed_agree(dataset):
    out = run(sys.executable, "examples/demo.py", *TINY[:6])  # --max-examples 24: all of them, shuffled
    table = {line[:28].strip(): line[28:].split() for line in out.splitlines() if line[:28].strip()}
    padded, packed = zip(*(table[key] for key in ("tokens", "optimizer steps", "token slots computed")))
    assert padded[:2] == packed[:2] == (f"{dataset[1]:,}", "6")
    assert number(padded[2]) > number(packed[2]) == dataset[1]
    assert table["padding fraction"][1] == "0.0%" and number(table["padding fraction"][0]) > 0
    first = [float(x) for x in table["first-step loss"]]
    final = [float(x) for x in table["final loss"]]
    assert abs(first[0] - first[1]) < 1e-4 and abs(final[0] - final[1]) < 1e-2
    assert "x faster than padded" in out


@pytest.mark.slow
def test_chat_tokenize_script_agrees_with_the_scripts_dataset(dataset):
    """Both ways of finding the answers give the same labels, and the logged counts are the training scripts'."""
    out = run(
        sys.executable, "examples/chat_tokenize.py", "--max-examples", "24", "--max-length", "96", "--repeats", "1"
    )
    examples, tokens, _ = dataset
    assert "prefixes and markers give the same labels: True" in out
    assert f"tokenize_chat: 24 examples -> {examples} kept, {tokens:,} tokens" in out
    assert out.count("conversations/s") == 3


@pytest.mark.slow
def test_the_vision_language_script_trains_packed_images_and_text():
    out = run(sys.executable, "examples/sft_vlm.py", "--examples", "24", "--max-steps", "2", "--max-tokens-per-batch", "600")
    assert "12 with an image, 12 text only" in out
    assert "steps:          2 in" in out
    packed, alone = (float(x) for x in re.search(r"packed = alone: (\S+) vs (\S+)", out).groups())
    assert packed == pytest.approx(alone, rel=1e-5)  # images and text of four examples in one row: each exact
    assert len(re.search(r"losses:\s+(.*)", out).group(1).split(", ")) == 2


@pytest.mark.slow
def test_the_dpo_script_trains_the_same_steps_with_shared_prompts():
    """Packed DPO pairs, then each prompt once: the same losses and rewards step by step (the layouts agree)."""
    tiny = ["--max-pairs", "24", "--batch-size", "4", "--max-steps", "4", "--max-length", "96", "--lr", "1e-3"]
    packed = run(sys.executable, "examples/dpo_packing.py", *tiny)
    shared = run(sys.executable, "examples/dpo_packing.py", *tiny, "--share-prompt")
    steps = [line for line in packed.splitlines() if line.startswith("step ")]
    assert len(steps) == 4 and steps == [line for line in shared.splitlines() if line.startswith("step ")]
    assert any(number(line.split("rewards/margins")[1]) != 0 for line in steps[1:])  # the policy moved
    assert "pairs: 24; optimizer steps: 4" in packed and "(shared prompts)" in shared


@pytest.mark.slow
def test_the_grpo_script_trains_on_packed_rows_with_and_without_shared_prompts():
    """TRL's generation and loss, the completions scored on packed rows: both layouts train the planned steps."""
    tiny = ["--max-prompts", "16", "--max-steps", "2"]
    for options, title in (([], "== PackingGRPOTrainer =="), (["--share-prompt"], "(shared prompts)")):
        out = run(sys.executable, "examples/grpo.py", *tiny, *options)
        assert title in out and "prompts: 16; completions per prompt: 4; optimizer steps: 2" in out
        steps = [line for line in out.splitlines() if line.startswith("step ")]
        assert len(steps) == 2 and all("reward" in line and "entropy" in line for line in steps)
