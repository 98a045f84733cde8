"""The GRPO update-side harness (benchmarks/gpu/grpo_update.py) in its CPU --smoke form: TRL's GRPOTrainer and
PackingGRPOTrainer(share_prompt=True) timed on the same groups, and --compare writing the ratios from their JSONs.
On the CPU both run sdpa in float32: their gradient norms agree (the harness compares what the GPU rows report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _preloaded import run as preloaded_run

pytest.importorskip("trl")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "grpo_update.py"


@pytest.mark.slow
def test_the_harness_times_both_trainers_on_the_same_groups_and_compares_them(tmp_path):
    smoke = ["--smoke", "--steps", "2", "--warmup", "1", "--prompts", "1024,2000,2048", "--generate", "1",
             "--generate-tokens", "4", "--out", str(tmp_path)]  # fmt: skip
    for setting in ("trl", "shared"):  # each its own process, forked with its imports done
        code, out, err = preloaded_run([str(SCRIPT), *smoke, "--setting", setting])
        assert code == 0, (out + err)[-3000:]
    trl, shared = (json.loads((tmp_path / f"qwen3_{s}.json").read_text()) for s in ("trl", "shared"))
    assert [s["tokens"] for s in trl["steps"]] == [s["tokens"] for s in shared["steps"]]  # the same groups
    assert all(s["padded_positions"] >= s["tokens"] for s in trl["steps"])
    assert all(1024 // 16 <= s["prompt"] <= 2048 // 16 for s in trl["steps"])  # --prompts, scaled down by --smoke
    assert trl["attention"] == shared["attention"] == "sdpa" and trl["device"] == "cpu"
    assert trl["forward_autocast"] == shared["forward_autocast"] == ["none"]  # float32 throughout: no bf16 asked for
    for run in (trl, shared):  # TRL's generation timed on the first group's prompt, on both sides alike
        assert run["generation"]["prompts"] == [trl["steps"][0]["prompt"]] and run["generation"]["error"] is None
        assert run["generation"]["attention"] == "sdpa"  # what the first decoding forward ran under
        assert len(run["generation"]["seconds"]) == 1 and run["generation"]["completion_tokens"] == 4
    out = subprocess.run([sys.executable, str(SCRIPT), "--compare", "--out", str(tmp_path)], capture_output=True, text=True)
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["setting"] == "shared" and "| qwen3 | shared | 1024,2000,2048 | sdpa / sdpa | float32 (no autocast) |" in out.stdout
    assert row["weights"] == row["trl_weights"] == "torch.float32"  # the smoke's CPU model, float32 on both sides
    assert row["update_tokens_per_s_vs_trl"] == pytest.approx(shared["median_tokens_per_s"] / trl["median_tokens_per_s"])
    assert row["grad_norm_max_rel_diff_vs_trl"] < 1e-4  # float32: the same gradients, packed and padded
    whole = shared["generation"]["median_seconds"] + shared["median_update_seconds"]
    trl_whole = trl["generation"]["median_seconds"] + trl["median_update_seconds"]
    assert row["whole_step_vs_trl"] == pytest.approx(trl_whole / whole)


@pytest.mark.slow
def test_the_harness_times_rloo_the_same_way(tmp_path):
    # --same-group: every step the first group's lengths; --profile-step: that step's tables, its kernels' time
    smoke = ["--smoke", "--trainer", "rloo", "--steps", "2", "--warmup", "1", "--same-group", "--profile-step", "1",
             "--out", str(tmp_path)]  # fmt: skip
    for setting in ("trl", "packed"):
        code, out, err = preloaded_run([str(SCRIPT), *smoke, "--setting", setting])
        assert code == 0, (out + err)[-3000:]
    trl, packed = (json.loads((tmp_path / f"rloo_qwen3_{s}.json").read_text()) for s in ("trl", "packed"))
    assert trl["trainer"] == packed["trainer"] == "rloo"
    assert [s["tokens"] for s in trl["steps"]] == [s["tokens"] for s in packed["steps"]]
    assert len({(s["prompt"], s["tokens"]) for s in packed["steps"]}) == 1 and len(packed["steps"]) == 3
    profiles = [s.get("profile") for s in packed["steps"]]
    assert profiles[0] is None is profiles[2] and profiles[1]["kernels_ms"] == 0  # the CPU: no kernels
    assert "aten::mm" in (tmp_path / profiles[1]["tables"]).read_text()  # the host's ops, the step's matmuls among them
    assert [s["warmup"] for s in packed["steps"]] == [True, True, False]  # the profiled step is not timed
    code, out, err = preloaded_run([str(SCRIPT), *smoke, "--setting", "packed", "--profile-step", "3"])
    assert code == 2 and "--profile-step 3: the run has steps 0 to 2" in err
    subprocess.run([sys.executable, str(SCRIPT), "--compare", "--out", str(tmp_path)], check=True, capture_output=True)
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert (row["trainer"], row["setting"]) == ("rloo", "packed")
    assert row["update_tokens_per_s_vs_trl"] == pytest.approx(packed["median_tokens_per_s"] / trl["median_tokens_per_s"])
    assert row["grad_norm_max_rel_diff_vs_trl"] < 1e-4
    # old_logps are each side's policy before its step, as TRL's generation computes them: every sequence's ratio is
    # 1, so RLOO's loss is minus the mean advantage at every step (a guessed old_logps sits far off 1 over a
    # sequence's tokens, clipped or exp of a sum of bf16 roundings: the GPU's gradients then compared nothing)
    sys.path.insert(0, str(SCRIPT.parent))
    import grpo_update

    args = grpo_update.arguments(smoke)
    for index, (prompt, completions) in enumerate(grpo_update.step_groups(args)):
        advantages = grpo_update.group_inputs(prompt, completions, 512, args.seed + index, "cpu")["advantages"]
        assert trl["losses"][index] == pytest.approx(-float(advantages.mean()), abs=1e-5)
        assert packed["losses"][index] == pytest.approx(-float(advantages.mean()), abs=1e-5)


def test_the_steady_ratio_pairs_the_same_groups_and_leaves_out_the_steps_where_a_side_compiled():
    sys.path.insert(0, str(SCRIPT.parent))
    import grpo_update

    def steps(seconds, tokens=(1000, 2000, 3000, 1000)):
        return [{"tokens": 50, "seconds": 9.0, "warmup": True}] + [
            {"tokens": t, "seconds": s, "warmup": False} for t, s in zip(tokens, seconds)]  # fmt: skip

    ours, trl = steps([0.5, 1.0, 1.5, 0.5]), steps([1.0, 2.0, 30.0, 0.5])  # TRL compiled at its third timed group
    row = grpo_update.steady_ratio(ours, trl)
    assert row["steady_update_vs_trl"] == 2.0 and (row["steady_steps"], row["trl_stalled_steps"]) == (3, 1)
    assert row["per_step_update_vs_trl"] == [2.0, 2.0, 20.0, 1.0]
    assert grpo_update.steady_ratio(ours, trl[:3])["steady_steps"] == 2  # a run its time limit stopped: the common steps
    with pytest.raises(AssertionError, match="same groups"):
        grpo_update.steady_ratio(ours, steps([1.0] * 4, tokens=(1000, 2000, 3001, 1000)))


def test_a_run_its_time_limit_stopped_before_a_timed_step_is_listed_with_its_warm_ups_not_compared(tmp_path, capsys):
    # the hybrid's first GPU rerun: TRL's process compiled its padded shapes past its limit and left nothing to divide by
    sys.path.insert(0, str(SCRIPT.parent))
    import doctest

    import grpo_update

    assert doctest.testmod(grpo_update, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0
    step = {"tokens": 1000, "seconds": 0.5, "grad_norm": 1.0}
    packed = {"setting": "packed", "attention": "sdpa", "device": "cpu", "prompts": "64,1000,4096", "peak_gib": None,
              "median_tokens_per_s": 2000.0, "median_update_seconds": 0.5,
              "steps": [{**step, "warmup": True}, {**step, "warmup": False}]}  # fmt: skip
    warmed = {"setting": "trl", "steps": [{**step, "seconds": 41.5, "warmup": True}], "median_tokens_per_s": None,
              "partial": True, "stopped_after_s": 60}  # fmt: skip
    (tmp_path / "qwen3_packed.json").write_text(json.dumps(packed))
    (tmp_path / "qwen3_trl.json").write_text(json.dumps(warmed))
    (tmp_path / "qwen3_5_trl.json").write_text(json.dumps({"setting": "trl", "steps": [], "partial": True}))
    (tmp_path / "qwen3_5_packed.json").write_text(json.dumps({**packed, "error": "Traceback\nRuntimeError: boom\n"}))
    assert grpo_update.compare(tmp_path) == []
    out = capsys.readouterr().out
    assert "qwen3_trl: no timed step; stopped after 1 warm-up step (41.5 s for 1,000 tokens)" in out
    assert "qwen3_5_trl: no timed step; stopped before its first step ended" in out
    assert "qwen3_5_packed: failed: RuntimeError: boom" in out
    assert "qwen3_packed" not in out  # finished: it waits for a TRL row to be divided by
    (tmp_path / "qwen3_trl.json").write_text(json.dumps({**packed, "setting": "trl"}))
    (row,) = grpo_update.compare(tmp_path)
    assert row["update_tokens_per_s_vs_trl"] == 1.0


@pytest.mark.slow
def test_float32_weights_run_under_the_trainers_bf16_autocast_on_both_sides(tmp_path):
    # TRL's defaults: bf16=True over float32 weights, which Trainer.train() turns into accelerate's autocast around
    # the model's forward. The harness calls compute_loss itself, so it must prepare the model as train() does; a run
    # that skipped it would time float32 layers (and FA4 would refuse them) while its table said "TRL's defaults".
    smoke = ["--smoke", "--weights", "float32", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)]
    for setting in ("trl", "packed"):
        code, out, err = preloaded_run([str(SCRIPT), *smoke, "--setting", setting])
        assert code == 0, (out + err)[-3000:]
    for setting in ("trl", "packed"):
        run = json.loads((tmp_path / f"qwen3_{setting}.json").read_text())
        assert run["weights"] == "torch.float32" and run["forward_autocast"] == ["torch.bfloat16"], run
    out = subprocess.run([sys.executable, str(SCRIPT), "--compare", "--out", str(tmp_path)], capture_output=True, text=True)
    assert "| sdpa / sdpa | float32 (autocast bfloat16) |" in out.stdout  # the table names TRL's defaults as run
