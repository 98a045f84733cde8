"""The TRL comparison harness measures what its table says (benchmarks/gpu/vs_trl.py, in its CPU --smoke form).

Two ``--all --smoke`` drivers, one per pair (each setting its own process, as on the GPU; forked here with its
imports done, ``_preloaded.drive``):
trl_padding_free + ours_flattening, trl_bfd + ours_packing. Then ``--compare`` writes the rows. Checked: the
flattening pair trains the same batches (tokens and token-id checksums per step) with the same step-1 loss, the
loss is a per-token mean (about ln of the vocabulary at a random init), packed steps stay within the budget and
fill it, the rates are the steps' own, and each row's ratios are ours / TRL's of the two JSON files. The auto
settings measure GPU memory; their TRL step (``trl_step_peak``) is run here on the CPU with the memory counters
stubbed, to check it runs TRL's own collator and loss twice on the row it is asked for.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from _preloaded import drive

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "vs_trl.py"
PAIRS = {"flat": "trl_padding_free,ours_flattening", "packed": "trl_bfd,ours_packing"}
SMOKE = ["--smoke", "--steps", "3", "--warmup", "1"]  # 4 steps; budget 512, batch 8, vocab 512
VOCAB, BUDGET, BATCH, STEPS = 512, 512, 8, 4

pytest.importorskip("trl")
pytestmark = pytest.mark.slow


def _harness():
    spec = importlib.util.spec_from_file_location("vs_trl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts benchmarks/gpu on sys.path: its _vs_trl_* helpers import
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both pairs' JSON files, gathered in one folder after ``--compare`` there; name -> parsed JSON."""
    base = tmp_path_factory.mktemp("vs_trl")
    harness = _harness()
    for pair, names in PAIRS.items():  # each setting its own process, forked with the imports done
        output = drive(harness.main, ["--all", "--settings", names, *SMOKE, "--out", str(base / pair)])
        assert "FAILED" not in output, output[-4000:]
    both = base / "both"
    both.mkdir()
    for path in [p for pair in PAIRS for p in (base / pair).glob("*_gc_on.json")]:
        shutil.copy(path, both)
    done = subprocess.run([sys.executable, str(SCRIPT), "--compare", "--out", str(both)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    # the like-for-like runs (every side eager: --torch-compile off, the default) say so in their names
    return {p.stem.rsplit(f"_eager_both_{VOCAB}_", 1)[0]: json.loads(p.read_text()) for p in both.glob("*_gc_on.json")} | {
        "results": json.loads((both / "results.json").read_text()),
        "readme": (both / "README.md").read_text(),
    }


def test_every_setting_writes_its_figures(runs):
    for name in ("trl_padding_free", "ours_flattening", "trl_bfd", "ours_packing"):
        run = runs[name]
        assert run["setting"] == name and run["vocab"] == VOCAB and run["grad_checkpointing"] is True
        assert run["steps_run"] == STEPS and len(run["steps"]) == STEPS
        assert f"--setting {name}" in run["command"] and run["versions"]["torch"] and run["device"] == "cpu"
        assert run["side"] == name.split("_")[0] and run["attention"] == "sdpa"
        stats = run["statistics"]
        rates = [s["tokens"] / s["seconds"] for s in run["steps"][1:]]  # the warm-up step left out
        assert stats["median_tokens_per_s"] == pytest.approx(statistics.median(rates))
        assert stats["timed_steps"] == STEPS - 1
        assert run["first_losses"] == [s["loss"] for s in run["steps"]][:5]
        # a per-token mean cross-entropy at a random init over uniform tokens: about ln(vocab), not a sum
        assert abs(run["first_losses"][0] - math.log(VOCAB)) < 0.1
    assert runs["trl_bfd"]["loss"] == "TRL fused LM head" and runs["ours_packing"]["loss"] == "PackingTrainer chunked"
    assert runs["ours_flattening"]["loss"] == "enable_chunked_loss"
    # PackingTrainer's parts before step 1 (the CPU: the budget planned, no dry run; no FA4 warm-up); TRL's trainer has none
    assert set(runs["ours_packing"]["startup_parts_s"]) == {"token_budget", "checks_and_probe"}
    assert runs["trl_bfd"]["startup_parts_s"] is None
    assert runs["ours_packing"]["triton_variants"] == {}  # the CPU runs torch's ops: no kernel built


def test_flattening_trains_the_same_batches_as_trl_padding_free(runs):
    ours, theirs = runs["ours_flattening"]["steps"], runs["trl_padding_free"]["steps"]
    assert [(s["tokens"], s["examples"], s["checksum"]) for s in ours] == [
        (s["tokens"], s["examples"], s["checksum"]) for s in theirs
    ]
    assert all(s["examples"] == BATCH for s in ours) and len({s["tokens"] for s in ours}) > 1
    assert abs(ours[0]["loss"] - theirs[0]["loss"]) < 1e-4  # step 1: the same weights and batch


def test_packed_steps_fill_the_budget(runs):
    for name in ("trl_bfd", "ours_packing"):
        tokens = [s["tokens"] for s in runs[name]["steps"]]
        assert max(tokens) <= BUDGET and sum(tokens) / len(tokens) > 0.75 * BUDGET, (name, tokens)
    assert runs["trl_bfd"]["padding_free"] is True  # TRL turns it on for bfd
    assert runs["ours_packing"]["max_tokens_per_batch"] == BUDGET


def test_compare_rows_are_ours_over_trl(runs):
    rows = {row["setting"]: row for row in runs["results"]}
    assert set(rows) == {f"ours_flattening_eager_both_{VOCAB}_gc_on", f"ours_packing_eager_both_{VOCAB}_gc_on"}
    for ours, theirs in (("ours_flattening", "trl_padding_free"), ("ours_packing", "trl_bfd")):
        row = rows[f"{ours}_eager_both_{VOCAB}_gc_on"]
        a, b = runs[ours]["statistics"], runs[theirs]["statistics"]
        assert row["vs"] == f"{theirs}_eager_both_{VOCAB}_gc_on" and row["vocab"] == VOCAB and row["grad_checkpointing"] is True
        assert row["tokens_per_s"] == a["median_tokens_per_s"] and row["trl_tokens_per_s"] == b["median_tokens_per_s"]
        assert row["tokens_per_s_vs_trl"] == pytest.approx(a["median_tokens_per_s"] / b["median_tokens_per_s"])
        assert "peak_memory_vs_trl" in row and row["peak_memory_vs_trl"] is None  # no GPU memory on a CPU
        # process start (here the fork from the preloaded server) to the end of step 1: the step itself and the set-up
        for run in (runs[ours], runs[theirs]):
            assert run["steps"][0]["seconds"] + run["setup_seconds"] <= run["first_step_s"] + 0.05  # ticks of 10 ms
            assert run["first_step_s"] <= run["setup_seconds"] + run["train_call_seconds"] + 60
        assert row["first_step_vs_trl"] == pytest.approx(runs[ours]["first_step_s"] / runs[theirs]["first_step_s"])
    flat = rows[f"ours_flattening_eager_both_{VOCAB}_gc_on"]
    assert flat["same_batches"] is True and flat["first_loss_equal"] is True and flat["first_loss_abs_diff"] < 1e-4
    assert f"| ours_flattening_eager_both_{VOCAB}_gc_on | trl_padding_free_eager_both_{VOCAB}_gc_on | {VOCAB} | on |" in runs["readme"]


def test_trl_step_peak_runs_trls_own_step_twice(monkeypatch, tmp_path):
    import torch

    harness = _harness()
    import _vs_trl_settings as settings

    args = harness._arguments(["--setting", "trl_auto_cap", "--smoke", "--out", str(tmp_path)])
    model = settings.build_model(args, torch.device("cpu"))
    trainer = settings.trl_trainer(args, model, settings.make_dataset(args, 32), 1, packing=True, max_length=BUDGET)
    batches, compute = [], trainer.compute_loss
    monkeypatch.setattr(trainer, "compute_loss", lambda m, inputs, **kw: batches.append(inputs) or compute(m, inputs))
    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 1 << 40)
    peak = settings.trl_step_peak(trainer, 300, 128)
    states = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    assert peak == (1 << 40) - states  # the states made between the passes are left out, as the library does
    assert len(batches) == 2 and batches[0]["input_ids"].shape == (1, 300)
    assert batches[0]["cu_seq_lens_q"].tolist() == [0, 128, 256, 300]  # TRL's collator read the row's seq_lengths
    assert all(p.grad is None for p in model.parameters())


def test_step_statistics_examples():
    _harness()
    import _vs_trl_measure

    assert doctest.testmod(_vs_trl_measure).failed == 0


def test_fa4_calls_go_through_the_int_lengths_wrapper_and_are_counted(monkeypatch):
    import types

    import torch

    _harness()
    import _vs_trl_measure

    calls = []
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func = lambda *args, **kwargs: calls.append(kwargs) or "out"
    package = types.ModuleType("flash_attn")
    package.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    counters = _vs_trl_measure.fa4_int_lengths()  # ulysses_vs_deepspeed.py's wrapper, then the counting one
    assert cute.flash_attn_varlen_func("q", max_seqlen_q=torch.tensor(7), max_seqlen_k=torch.tensor(9)) == "out"
    cute.flash_attn_varlen_func("q", max_seqlen_q=5, max_seqlen_k=5)
    assert calls == [{"max_seqlen_q": 7, "max_seqlen_k": 9}, {"max_seqlen_q": 5, "max_seqlen_k": 5}]
    assert all(type(v) is int for call in calls for v in call.values())
    assert counters == {"installed": True, "calls": 2, "tensor_lengths": 1}


@pytest.fixture(scope="module")
def compile_modes(tmp_path_factory):
    """Our two settings under ``--torch-compile on`` and ``defaults``, both drivers at once; mode -> its folder."""
    base = tmp_path_factory.mktemp("vs_trl_compile")
    harness = _harness()
    for mode in ("on", "defaults"):
        argv = ["--all", "--settings", "ours_packing,ours_flattening", *SMOKE, "--torch-compile", mode]
        output = drive(harness.main, [*argv, "--out", str(base / mode)])
        assert "FAILED" not in output, output[-4000:]
    return {mode: base / mode for mode in ("on", "defaults")}


def test_torch_compile_on_compiles_our_layers_and_keeps_the_chunked_loss(compile_modes):
    # --torch-compile on: PackingTrainer(torch_compile=True) compiles its layers (the chunked loss stays), the
    # stock Trainer side calls compile_layers(model); the names and JSONs say so, and --compare pairs compiled runs
    # with compiled runs only (an eager TRL run beside them is not their pair).
    tmp_path = compile_modes["on"]
    packing = json.loads((tmp_path / f"ours_packing_compiled_both_{VOCAB}_gc_on.json").read_text())
    flattening = json.loads((tmp_path / f"ours_flattening_compiled_both_{VOCAB}_gc_on.json").read_text())
    assert packing["compiled"] is True and packing["loss"] == "PackingTrainer chunked"
    assert packing["compile"].startswith("torch.compile: ") and "0 recompiles since" in packing["compile"]
    assert flattening["compiled"] is True and flattening["loss"] == "enable_chunked_loss + compile_layers"
    assert "--torch-compile on" in packing["command"]
    _harness()
    import _vs_trl_report

    eager_trl = {**packing, "setting": "trl_bfd", "name": "trl_bfd", "side": "trl", "compiled": False}
    assert _vs_trl_report.pair_rows([packing, eager_trl]) == []
    compiled_trl = {**eager_trl, "compiled": True}
    assert [row["compiled"] for row in _vs_trl_report.pair_rows([packing, compiled_trl])] == [True]
    # its steps count real tokens: the bucket's padding segment (token 0, no target) is neither a token nor an example
    budget = packing["max_tokens_per_batch"]
    assert all(0 < step["tokens"] <= budget for step in packing["steps"])
    assert any(step["tokens"] < budget for step in packing["steps"])  # a row the bucket padded
    # --recount turns a run counted the old way (every step the bucket, the padding an example) into this one
    import _vs_trl_recount
    import vs_trl

    path = tmp_path / f"ours_packing_compiled_both_{VOCAB}_gc_on.json"
    old = json.loads(path.read_text())
    for step in old["steps"]:
        step["examples"] += int(step["tokens"] < budget)
        step["tokens"] = budget
    path.write_text(json.dumps(old))
    assert _vs_trl_recount.recount(tmp_path, vs_trl._arguments) == [path.name]
    fixed = json.loads(path.read_text())
    assert [(s["tokens"], s["examples"]) for s in fixed["steps"]] == [(s["tokens"], s["examples"]) for s in packing["steps"]]
    assert fixed["statistics"]["mean_tokens_per_step"] == pytest.approx(packing["statistics"]["mean_tokens_per_step"])
    old["steps"][1]["checksum"] += 1  # another micro-batch than the plan's: refused, the file left alone
    old.pop("recounted", None)
    path.write_text(json.dumps(old))
    with pytest.raises(SystemExit, match="step 2 is not the planned micro-batch"):
        _vs_trl_recount.recount(tmp_path, vs_trl._arguments)


def test_torch_compile_defaults_runs_each_side_as_its_user_gets_it(compile_modes):
    # --torch-compile defaults: PackingTrainer keeps its compile_layers="auto" (eager on this CPU, compiled layers
    # on a GPU), the stock Trainer side adds compile_layers(model) to enable_chunked_loss(model), TRL stays eager;
    # the pairs are taken among the _defaults runs only.
    tmp_path = compile_modes["defaults"]
    packing = json.loads((tmp_path / f"ours_packing_defaults_{VOCAB}_gc_on.json").read_text())
    flattening = json.loads((tmp_path / f"ours_flattening_defaults_{VOCAB}_gc_on.json").read_text())
    assert packing["compiled"] == "defaults" and packing["compile"] is None  # "auto" on a CPU: eager
    assert packing["loss"] == "PackingTrainer chunked"
    assert flattening["loss"] == "enable_chunked_loss + compile_layers"
    _harness()
    import _vs_trl_report

    trl = {**packing, "setting": "trl_bfd", "name": "trl_bfd_defaults", "side": "trl"}
    assert _vs_trl_report.pair_rows([packing, {**trl, "compiled": False}]) == []
    (row,) = _vs_trl_report.pair_rows([packing, trl])
    assert row["compiled"] == "defaults" and "defaults (ours' layers; TRL eager)" in _vs_trl_report.readme([row], [packing])


def test_a_memory_cap_names_its_runs_and_pairs_them_only_with_runs_under_the_same_cap(tmp_path):
    harness = _harness()
    import _vs_trl_report

    capped = harness._arguments(["--setting", "ours_auto", "--memory-cap-gib", "79", "--vocab", "151936", "--out", "x"])
    assert harness.run_name(capped, "ours_auto") == "ours_auto_eager_both_cap79_151936_gc_on"
    whole = harness._arguments(["--setting", "ours_auto", "--vocab", "151936", "--out", "x"])
    assert harness.run_name(whole, "ours_auto") == "ours_auto_eager_both_151936_gc_on"
    with pytest.raises(SystemExit):
        harness._arguments(["--setting", "ours_auto", "--memory-cap-gib", "0", "--out", "x"])
    run = {"setting": "ours_auto", "side": "ours", "vocab": 1, "grad_checkpointing": True, "options": {"memory_cap_gib": 79.0}}
    trl = {**run, "setting": "trl_auto_cap", "side": "trl"}
    assert _vs_trl_report.pair_rows([run, {**trl, "options": {"memory_cap_gib": None}}]) == []


def test_fused_norms_name_ours_and_reach_every_settings_process(tmp_path):
    harness = _harness()
    args = harness._arguments(["--all", "--settings", "ours_packing,trl_bfd", "--fused-norms", "--out", str(tmp_path)])
    assert harness.run_name(args, "ours_packing") == "ours_packing_fusednorms_eager_both_32000_gc_on"
    assert harness.run_name(args, "trl_bfd") == "trl_bfd_eager_both_32000_gc_on"  # TRL's side runs its model as is
    assert "--fused-norms" in harness._child_command(args, "ours_packing")
    both = harness._arguments(["--all", "--settings", "ours_packing,trl_bfd", "--fused-norms", "--fused-mlp", "--out", "x"])
    assert harness.run_name(both, "ours_packing") == "ours_packing_fusednorms_fusedmlp_eager_both_32000_gc_on"
    assert harness.run_name(both, "trl_bfd") == "trl_bfd_eager_both_32000_gc_on"
    assert "--fused-mlp" in harness._child_command(both, "ours_packing")
    plain = harness._arguments(["--all", "--settings", "ours_packing,trl_bfd", "--out", str(tmp_path)])
    assert "--fused-norms" not in harness._child_command(plain, "ours_packing")  # a switch off is left out, not "False"
    assert "--fused-mlp" not in harness._child_command(plain, "ours_packing")
    rope = harness._arguments(["--all", "--settings", "ours_packing", "--fused-rope", "--out", "x"])
    assert harness.run_name(rope, "ours_packing") == "ours_packing_fusedrope_eager_both_32000_gc_on"
    assert "--fused-rope" in harness._child_command(rope, "ours_packing")
    assert "False" not in harness._child_command(plain, "ours_packing")


def test_a_fused_norms_run_trains_ours_with_every_norm_on_the_fused_kernel(tmp_path):
    harness = _harness()
    output = drive(harness.main, ["--all", "--settings", "ours_packing", *SMOKE, "--fused-norms", "--fused-mlp",
                                  "--fused-rope", "--out", str(tmp_path)])  # fmt: skip
    assert "FAILED" not in output, output[-4000:]
    (path,) = tmp_path.glob("ours_packing_fusednorms_fusedmlp_fusedrope_eager_both_*_gc_on.json")
    run = json.loads(path.read_text())
    assert run["options"]["fused_norms"] is True and run["options"]["fused_mlp"] is True
    assert run["options"]["fused_rope"] is True
    assert run["steps_run"] == run["steps_planned"]
