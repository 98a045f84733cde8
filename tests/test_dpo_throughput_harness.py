"""The DPO throughput harness measures what its table says (benchmarks/gpu/dpo_throughput.py, its CPU --smoke form).

Three ``--all --smoke --mix long_prompt`` drivers (trl, packed, shared: each its own process as on the GPU; forked
here with its imports done, ``_preloaded.drive``), then ``--compare`` writes the rows from the JSON files gathered in
one folder. Checked: each run's JSON holds its figures (rates from its own steps, the mix's pairs per step, versions, the command); shared ran
or recorded a clean error while its driver went on; every setting trained the same pairs step by step (real tokens,
pairs, token-id checksums) and packed's loss equals trl's at every step within 1e-4 (float32); TRL's model ran
padded rows, packed's exactly the real tokens; results.json's ratios are ours / theirs of the JSON files, and
``--compare`` runs without torch. In process: a run whose trainer cannot be built records its error, and the
driver goes on past a run that times out or crashes (its JSON then says so) and past the deadline; without
--smoke, on a CPU made to look like one GPU, a run picks its device through vs_trl's ``_device`` (the code the GPU
takes) with the options this harness has: cuda:0, the whole card, up to the model.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from _preloaded import drive

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "dpo_throughput.py"
MIX, STEPS, WARMUP, VOCAB = "long_prompt", 6, 2, 512  # --smoke: 2 + 4 steps, vocab 512
DRIVERS = ("trl", "packed", "shared")  # a driver each, side by side

pytest.importorskip("trl")
pytestmark = pytest.mark.slow


def _harness():
    spec = importlib.util.spec_from_file_location("dpo_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts benchmarks/gpu on sys.path: its _dpo_* helpers import
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run's JSON (setting -> parsed), results.json, README.md and the drivers' output, after --compare."""
    base = tmp_path_factory.mktemp("dpo")
    harness = _harness()
    output = {side: drive(harness.main, ["--all", "--smoke", "--mix", MIX, "--settings", side, "--out", str(base / side)])
              for side in DRIVERS}  # fmt: skip
    both = base / "both"
    both.mkdir()
    for path in [p for side in DRIVERS for p in (base / side).glob("*_gc_on.json")]:
        shutil.copy(path, both)
    # --compare needs no torch: run it with torch made unimportable
    blocked = "import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", blocked, str(SCRIPT), "--compare", "--out", str(both)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = {p.stem.split("_")[2]: json.loads(p.read_text()) for p in both.glob(f"{MIX}_*_gc_on.json")}
    return found | {
        "results": json.loads((both / "results.json").read_text()),
        "readme": (both / "README.md").read_text(),
        "output": output,
    }


def _ran(run: dict) -> bool:
    return run["error"] is None


def test_every_run_writes_its_figures(runs):
    for name in ("trl", "packed"):
        run = runs[name]
        assert _ran(run), run["error"]
        assert run["setting"] == name and run["mix"] == MIX and run["grad_checkpointing"] is True and run["smoke"]
        assert run["steps_run"] == run["steps_planned"] == STEPS and len(run["steps"]) == STEPS
        assert f"--setting {name} --mix {MIX}" in run["command"] and run["device"] == "cpu"
        assert run["versions"]["torch"] and run["versions"]["trl"] and run["attention"] == "sdpa"
        rates = [s["tokens"] / s["seconds"] for s in run["steps"][WARMUP:]]
        assert run["statistics"]["median_tokens_per_s"] == pytest.approx(statistics.median(rates))
        assert run["statistics"]["timed_steps"] == STEPS - WARMUP
        assert run["first_losses"] == [s["loss"] for s in run["steps"]][:5]
        assert run["pairs_per_batch"] == 3 and all(s["examples"] == 3 for s in run["steps"])  # round(1024 / 407)
        assert run["data"]["pairs"] == 3 * STEPS and run["data"]["max_length"] == 256
        for step in run["steps"]:  # TRL's metric names, logged at every step
            assert {"loss", "rewards/margins", "rewards/chosen", "logps/chosen", "logps/rejected"} <= set(
                step["logged"]
            )
    assert runs["packed"]["first_losses"][0] == pytest.approx(0.6931, abs=1e-4)  # ln 2: policy = reference


def test_shared_ran_or_recorded_a_clean_error(runs):
    shared = runs["shared"]
    assert "[1/1] long_prompt_shared_gc_on" in runs["output"]["shared"] and "all runs:" in runs["output"]["shared"]
    if _ran(shared):
        assert shared["share_prompt"] is True and len(shared["steps"]) == STEPS
        # the same pairs, credited with the same real tokens; its row runs each prompt once: fewer tokens
        assert all(s["model_tokens"] < s["tokens"] for s in shared["steps"])
    else:
        error = shared["error"]
        assert error["type"] and error["message"] and error["phase"] and "FAILED" in runs["output"]["shared"]


def test_same_pairs_and_losses_as_trl(runs):
    trl, packed = runs["trl"]["steps"], runs["packed"]["steps"]
    key = lambda s: (s["tokens"], s["examples"], s["checksum"], s["prompt_tokens"])  # noqa: E731
    assert [key(s) for s in packed] == [key(s) for s in trl] and len({s["tokens"] for s in trl}) > 1
    if _ran(runs["shared"]):
        assert [key(s) for s in runs["shared"]["steps"]] == [key(s) for s in trl]
    for mine, theirs in zip(packed, trl):  # float32: the same loss at every step, the weights moving (lr 1e-3)
        assert mine["loss"] == pytest.approx(theirs["loss"], abs=1e-4)
    assert len({round(s["loss"], 4) for s in trl}) > 1
    # TRL's model ran the chosen and rejected rows padded to the longest; packed's exactly the real tokens
    assert all(s["model_tokens"] == s["tokens"] for s in packed)
    assert all(s["model_tokens"] > s["tokens"] for s in trl)


def test_compare_rows_are_ours_over_theirs(runs):
    rows = {row["setting"]: row for row in runs["results"]}
    assert set(rows) == {"packed", "shared"}
    median = {name: runs[name]["statistics"]["median_tokens_per_s"] for name in runs if name in ("trl", "packed")}
    packed = rows["packed"]
    assert packed["mix"] == MIX and packed["error"] is None and packed["pairs_per_batch"] == 3
    assert packed["tokens_per_s"] == median["packed"] and packed["trl_tokens_per_s"] == median["trl"]
    assert packed["packed_vs_trl"] == pytest.approx(median["packed"] / median["trl"])
    assert "peak_memory_vs_trl" in packed and packed["peak_memory_vs_trl"] is None  # no GPU memory on a CPU
    agreement = packed["agreement"]
    assert agreement["same_pairs"] is True and agreement["steps_compared"] == STEPS
    assert agreement["loss"]["max_abs"] < 1e-4 and len(agreement["loss"]["per_step_rel"]) == STEPS
    assert agreement["rewards/margins"]["max_abs"] < 1e-4 and len(agreement["rewards/margins"]["per_step_rel"]) == STEPS
    shared = rows["shared"]
    if _ran(runs["shared"]):
        theirs = runs["shared"]["statistics"]["median_tokens_per_s"]
        assert shared["packed_vs_trl"] == pytest.approx(theirs / median["trl"])
        assert shared["shared_vs_packed"] == pytest.approx(theirs / median["packed"])
        assert shared["agreement"]["same_pairs"] is True and shared["agreement"]["loss"]["max_abs"] < 1e-4
    else:
        assert shared["error"] and shared["packed_vs_trl"] is None and shared["shared_vs_packed"] is None
    assert f"| {MIX} | packed | on | 3 |" in runs["readme"] and f"| {MIX} | shared | on | 3 |" in runs["readme"]


def test_a_trainer_that_cannot_be_built_records_its_error(monkeypatch, tmp_path):
    harness = _harness()

    def refuse(*args, **kwargs):
        raise TypeError("DPOTrainer.__init__() got an unexpected keyword argument 'share_prompt'")

    monkeypatch.setattr(harness, "build_trainer", refuse)
    argv = ["--setting", "shared", "--mix", "short_prompt", "--smoke", "--steps", "1", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exited:
        harness.main(argv)
    assert exited.value.code == 1
    run = json.loads((tmp_path / "short_prompt_shared_gc_on.json").read_text())
    assert run["error"]["type"] == "TypeError" and "share_prompt" in run["error"]["message"]
    assert run["error"]["phase"] == "trainer" and run["versions"]["torch"] and run["device"] == "cpu"
    harness.compare(tmp_path)  # a failed run alone still gives its row, without figures
    (row,) = json.loads((tmp_path / "results.json").read_text())
    assert row["error"]["type"] == "TypeError" and row["packed_vs_trl"] is None and row["agreement"] is None


def test_the_driver_goes_on_past_failures_and_the_deadline(runs, monkeypatch, tmp_path, capsys):
    harness = _harness()

    def child(command, stdout, stderr, env, timeout):  # trl writes its JSON, packed times out, shared crashes
        setting, out = command[command.index("--setting") + 1], Path(command[command.index("--out") + 1])
        assert command[command.index("--mix") + 1] == MIX and "--smoke" in command and env["CUDA_VISIBLE_DEVICES"]
        if setting == "packed":
            raise subprocess.TimeoutExpired(command, timeout)
        if setting == "trl":
            (out / f"{MIX}_trl_gc_on.json").write_text(json.dumps(runs["trl"]))
        stdout.write("Segmentation fault\n")
        return subprocess.CompletedProcess(command, 0 if setting == "trl" else -11)

    monkeypatch.setattr(harness.subprocess, "run", child)
    harness.main(["--all", "--smoke", "--mix", MIX, "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    progress = [line for line in printed.splitlines() if line.startswith("[")]
    assert "[3/3] long_prompt_shared_gc_on" in printed and "Segmentation" in printed
    assert [line.split(", ")[1][:6] for line in progress[1::2]] == ["ok: me", "FAILED", "FAILED"]
    error = {s: json.loads((tmp_path / f"{MIX}_{s}_gc_on.json").read_text())["error"] for s in DRIVERS}
    assert error["trl"] is None and error["packed"]["type"] == "timeout" and error["shared"]["type"] == "crash"
    rows = {row["setting"]: row for row in json.loads((tmp_path / "results.json").read_text())}
    assert rows["packed"]["error"]["type"] == "timeout" and rows["packed"]["trl_tokens_per_s"] is not None
    harness.main(["--all", "--smoke", "--mix", MIX, "--deadline", "0", "--out", str(tmp_path)])
    assert all(json.loads((tmp_path / f"{MIX}_{s}_gc_on.json").read_text())["error"]["type"] == "deadline"
               for s in DRIVERS)  # fmt: skip


GPU = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def one_gpu(monkeypatch):
    """torch.cuda as on one 80 GiB GPU, on this CPU: the memory fractions set on it are recorded (fraction, device)."""
    _harness()  # benchmarks/gpu on sys.path
    import _dpo_data  # noqa: F401  (imported before CUDA looks present: what they import sees this machine)
    import _dpo_measure  # noqa: F401
    import _vs_trl_settings  # noqa: F401
    import datasets  # noqa: F401
    import torch
    import transformers  # noqa: F401
    import vs_trl  # noqa: F401

    fractions = []
    card = SimpleNamespace(total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: GPU)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: card)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: fractions.append((f, d)))
    return fractions


def test_the_gpu_path_picks_its_device_with_this_harness_options(one_gpu, monkeypatch, tmp_path):
    """Without --smoke the run gets through the device selection to the model, on cuda:0, the whole card (this
    harness has no --memory-cap-gib). It used to stop there: vs_trl._device read args.memory_cap_gib, which only
    vs_trl.py's parser defines (AttributeError in phase "imports", on the GPU alone: --smoke returned before it)."""
    harness = _harness()
    import _vs_trl_settings
    import torch

    built = []

    def build_model(args, device):  # the model is where this pretend GPU ends
        built.append(device)
        raise RuntimeError("no model on a pretend GPU")

    monkeypatch.setattr(_vs_trl_settings, "build_model", build_model)
    with pytest.raises(SystemExit) as exited:
        harness.main(["--setting", "packed", "--mix", MIX, "--out", str(tmp_path)])
    assert exited.value.code == 1
    run = json.loads((tmp_path / f"{MIX}_packed_gc_on.json").read_text())
    assert run["error"]["phase"] == "model and data", run["error"]
    assert run["error"]["message"] == "no model on a pretend GPU" and run["smoke"] is False
    assert run["device"] == GPU and built == [torch.device("cuda", 0)] and one_gpu == []  # no cap: the whole card


def test_the_device_selection_both_harnesses_share(one_gpu, monkeypatch):
    """vs_trl._device takes its options by name: the CPU under --smoke; else the one GPU, capped where asked."""
    import torch
    from vs_trl import _device

    assert _device(smoke=True) == torch.device("cpu") and one_gpu == []
    assert _device(smoke=False) == torch.device("cuda", 0) and one_gpu == []
    assert _device(smoke=False, memory_cap_gib=40) == torch.device("cuda", 0)
    assert one_gpu == [(0.5, torch.device("cuda", 0))]  # 40 of 80 GiB
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(SystemExit, match="CUDA_VISIBLE_DEVICES=0"):
        _device(smoke=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA GPU here"):
        _device(smoke=False)
    assert _device(smoke=True) == torch.device("cpu")


def test_helpers_examples():
    harness = _harness()
    import _dpo_data
    import _dpo_measure
    import _dpo_report

    for module in (_dpo_data, _dpo_measure, _dpo_report, harness):
        assert doctest.testmod(module).failed == 0, module.__name__
