"""The 8B harness measures what its table says (benchmarks/gpu/scale_8b.py and its _scale_8b_* helpers, issue #46).

On the CPU: two gloo ranks of ``--smoke`` (FSDP2, activation checkpointing, the chunked loss, 4 sampler ranks so each
process accumulates 2 micro-batches) train exactly the losses of one process replaying the same 4-rank plan, which
the GPU plan's loss check relies on; the FLOPs count is torchtitan's (its 8B count and published MFU, the HF model's
parameters); torchtitan's step lines parse to their numbers; the rows, the scaling and the loss verdict are
computed from the runs as the docstrings say.
"""

from __future__ import annotations

import doctest
import importlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
from _preloaded import run as preloaded_run
from _two_ranks import free_port, run_two_ranks

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
SCRIPT = GPU / "scale_8b.py"
sys.path[:0] = [str(GPU), str(ROOT / "benchmarks")]

metrics = importlib.import_module("_scale_8b_metrics")
plan = importlib.import_module("_scale_8b_plan")
results_of = importlib.import_module("_scale_8b_results")
report_of = importlib.import_module("_scale_8b_report")

SMOKE = ["--smoke", "--replicas", "4", "--steps", "3", "--warmup", "1"]
WORKER = """
import runpy, sys
sys.argv = [{script!r}, *{smoke!r}, "--name", "two_ranks", "--out", sys.argv[1], "--prefetch", "2",
            "--profile-step", "1"]
runpy.run_path({script!r}, run_name="__main__")
"""

# torchtitan 0.2.2's lines (MetricsProcessor.log, tools/logging.py's format), as torchrun --role rank --tee 3 prefixes
# them; the second with its colour codes (metrics.disable_color_printing off)
TITAN_LOG = """\
[rank0]:[titan] 2026-11-27 17:59:10,662 - root - INFO - Model scale8b_llama3 8B size: 8,030,261,248 total parameters
[rank0]:[titan] 2026-11-27 17:59:10,743 - root - INFO - Peak FLOPS used for computing MFU: 9.890e+14
[rank0]:[titan] 2026-11-27 17:59:10,746 - root - INFO - Training starts at step 1
[rank0]:[titan] 2026-11-27 17:59:31,194 - root - INFO - step:  1  loss: 12.26104  grad_norm:  6.8913  memory: 38.95GiB(49.22%)  tps: 1,103  tflops: 63.88  mfu: 6.46%
[rank0]:[titan] 2026-11-27 17:59:32,511 - root - INFO - \x1b[31mstep:  2  \x1b[32mloss: 11.90512  \x1b[38;2;180;60;0mgrad_norm:  5.0021  \x1b[36mmemory: 41.20GiB(52.07%)  \x1b[34mtps: 6,012  \x1b[36mtflops: 348.19  \x1b[35mmfu: 35.21%\x1b[39m
[rank0]:[titan] 2026-11-27 17:59:33,824 - root - INFO - step:  3  loss: 11.51228  grad_norm:  4.1180  memory: 41.20GiB(52.07%)  tps: 6,000  tflops: 347.49  mfu: 35.14%
[rank0]:[titan] 2026-11-27 17:59:35,150 - root - INFO - step:  4  loss: 11.20001  grad_norm:  3.9000  memory: 41.30GiB(52.19%)  tps: 5,000  tflops: 289.57  mfu: 29.28%
[rank0]:[titan] 2026-11-27 17:59:36,150 - root - INFO - Training completed
"""


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """The 2-rank run and its 1-process replay of the same 4-rank plan, and a 1-process run of a 2-rank plan."""
    out = tmp_path_factory.mktemp("scale_8b")
    worker = WORKER.replace("{script!r}", repr(str(SCRIPT))).replace("{smoke!r}", repr(SMOKE))
    run_two_ranks(worker.replace("{", "{{").replace("}", "}}"), out, timeout=300)
    for name, replicas in (("replay", "4"), ("other_plan", "2")):  # forked with torch imported (_preloaded.py)
        env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(free_port())}  # fmt: skip
        args = [*SMOKE, "--name", name, "--out", str(out)]
        args[args.index("--replicas") + 1] = replicas
        code, stdout, stderr = preloaded_run([str(SCRIPT), *args], env=env, timeout=300)
        assert code == 0, stdout[-3000:] + stderr[-3000:]
    runs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    runs["traces"] = sorted(p.name for p in out.glob("*_trace.json.gz"))
    return runs


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_train_the_losses_of_the_one_process_replay(smoke_runs):
    two, replay, other = smoke_runs["two_ranks"], smoke_runs["replay"], smoke_runs["other_plan"]
    assert (two["gpus"], two["micro_batches_per_step_per_gpu"], replay["micro_batches_per_step_per_gpu"]) == (2, 2, 4)
    assert len(two["loss"]) == len(replay["loss"]) == 4
    # float32: the same weights, rows and updates (FSDP2's sharded AdamW included) give the same losses and norms
    assert max(abs(a - b) for a, b in zip(two["loss"], replay["loss"])) < 1e-5
    assert max(abs(a - b) / b for a, b in zip(two["grad_norm"], replay["grad_norm"])) < 1e-4
    assert abs(two["loss"][0] - math.log(256)) < 0.05  # a token mean at a random init, not a sum over ranks
    assert two["loss"][-1] < two["loss"][0]  # it trains: every weight moves (the head too)
    assert abs(other["loss"][0] - two["loss"][0]) > 1e-4  # another plan: other rows, another loss
    check = results_of.loss_check(two, replay)
    assert check["within_bf16_noise"] and check["steps_compared"] == 4
    assert 0.9 < two["fill"] <= 1.0  # multipack rows nearly fill the 1,024-token budget
    shape = metrics.TINY
    assert two["flops_per_token"] == metrics.flops_per_token(shape, 512)  # attention charged per 512-token document row
    assert two["mfu"] == pytest.approx(two["flops_per_token"] * two["tokens_per_s_per_gpu"] / 989e12)
    assert two["flops_per_token_causal_documents"] < two["flops_per_token"]  # documents are shorter than the row
    # the two ranks prefetched 2 layers' all-gathers and profiled step 1 (rank 0 kept the trace), the same losses
    assert (two["prefetch"], two["profile"]["step"], smoke_runs["traces"]) == (2, 1, ["two_ranks_trace.json.gz"])
    assert two["profile"]["kernels"] == 0 and two["profile"]["step_ms"] > 0  # the CPU has no GPU kernels to split


def test_the_flops_count_is_torchtitans_and_the_hf_model_has_those_parameters():
    import torch

    scale_8b = importlib.import_module("scale_8b")
    args = scale_8b.parse_args(["--attn", "sdpa"])
    model = scale_8b.build_model(args, torch.device("meta"), torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    assert (total, model.model.embed_tokens.weight.numel()) == metrics.parameters(metrics.LLAMA_3_1_8B)
    assert total == 8_030_261_248  # Llama-3.1-8B, and torchtitan's "size" line for its 8B
    assert metrics.flops_per_token(metrics.LLAMA_3_1_8B, 8192) == 57_914_449_920  # torchtitan 0.2.2's own count
    assert metrics.mfu(57_914_449_920, 5762) == pytest.approx(0.33741, abs=1e-5)  # its published 5,762 tokens/s
    # two documents of 3 and 5 tokens: queries attend 1+2+3 and 1+..+5 keys, 21 over 8 tokens
    tiny = metrics.TINY
    matmuls = 6 * (metrics.parameters(tiny)[0] - metrics.parameters(tiny)[1])
    assert metrics.causal_document_flops_per_token(tiny, [3, 5]) == pytest.approx(matmuls + 12 * 2 * 4 * 16 * 21 / 8)


def test_torchtitans_step_lines_parse_to_their_numbers():
    parsed = metrics.parse_titan_log(TITAN_LOG)
    assert parsed["peak_flops"] == 989e12 and parsed["parameters"] == 8_030_261_248
    assert [s["step"] for s in parsed["steps"]] == [1, 2, 3, 4]
    assert [s["tps"] for s in parsed["steps"]] == [1103.0, 6012.0, 6000.0, 5000.0]
    assert parsed["steps"][1] == {"step": 2, "loss": 11.90512, "grad_norm": 5.0021, "memory_gib": 41.2,
                                  "memory_pct": 52.07, "tps": 6012.0, "tflops": 348.19, "mfu_pct": 35.21}  # fmt: skip
    run = {"status": "ok", "flavor": "8B", **parsed, "data": {"rows": 4}}
    summary = results_of.titan_summary(run)  # steps after the first 3: step 4 alone
    assert summary["tokens_per_s_per_gpu"] == 5000.0 and summary["steps_timed"] == 1
    assert summary["mfu"] == pytest.approx(57_914_449_920 * 5000 / 989e12)
    assert summary["mfu_logged"] == pytest.approx(0.2928)
    assert summary["mfu_causal_documents"] == pytest.approx(
        metrics.causal_document_flops_per_token(metrics.LLAMA_3_1_8B, [8192]) * 5000 / 989e12
    )  # flavour 8B: one causal sequence per row


def test_the_rows_scaling_and_loss_verdict_come_from_the_runs():
    steps = [{"step": i, "loss": 12.0, "grad_norm": 1.0, "memory_gib": 40.0, "memory_pct": 50.0, "tps": t,
              "tflops": 0.0, "mfu_pct": 0.0} for i, t in enumerate([100.0, 100.0, 100.0, 4000.0, 6000.0], 1)]  # fmt: skip
    ours = {
        "status": "ok",
        "gpus": 4,
        "tokens_per_s_per_gpu": 6000.0,
        "mfu": 0.35,
        "mfu_causal_documents": 0.31,
        "peak_allocated_gib_per_gpu": [30.0, 31.0],
        "compile": False,
        "loss": [12.0, 11.0, 10.0],
        "card": "H100",
    }
    runs = {
        "ours_4": ours,
        "ours_2": {**ours, "gpus": 2, "tokens_per_s_per_gpu": 6200.0, "loss": [12.0, 11.1, 10.0]},
        "ours_1": {**ours, "gpus": 1, "tokens_per_s_per_gpu": 6400.0, "loss": [12.0, 11.5, 10.5]},
        "titan_varlen_4": {"status": "ok", "flavor": "8B_varlen", "steps": steps, "data": {"documents": [100] * 82}},
        "titan_causal_4": {"status": "exit 1", "steps": []},
    }  # fmt: skip
    results = results_of.build(runs)
    (row,) = [r for r in results["rows"] if r["torchtitan"] == "titan_varlen_4"]
    assert row["torchtitan_tokens_per_s_per_gpu"] == pytest.approx(
        4800.0
    )  # 2 steps of equal tokens: 2 / (1/4000 + 1/6000)
    assert row["ours_vs_torchtitan"] == pytest.approx(6000 / 4800)
    assert not any(r["torchtitan"] == "titan_causal_4" for r in results["rows"])  # a failed run makes no number
    assert results["scaling"]["per_gpu_efficiency"] == pytest.approx({"ours_1": 1.0, "ours_2": 6200 / 6400,
                                                                      "ours_4": 6000 / 6400})  # fmt: skip
    assert results["loss_vs_replay"]["ours_2"]["within_bf16_noise"]  # 0.1 / 11 < 2%
    assert not results["loss_vs_replay"]["ours_1"]["within_bf16_noise"]  # 0.5 / 11 > 2%
    table = report_of.markdown(results)
    assert "| 6,000 | 4,800 | 1.25 |" in table and "NOT within" in table


@pytest.mark.parametrize("name", ["_scale_8b_metrics", "_scale_8b_data", "_scale_8b_results", "_scale_8b_report",
                                  "scale_8b", "_trace_overlap", "_fused_norm"])
def test_the_helpers_docstring_examples(name):
    assert doctest.testmod(importlib.import_module(name)).failed == 0


def test_the_device_plan_gives_both_sides_the_same_settings(tmp_path):
    steps = {s.name: s for s in plan.plan_steps(tmp_path)}
    by_priority = ["env", "titan_causal_4", "ours_4", "ours_2", "titan_varlen_4", "ours_1", "titan030_import"]
    assert list(steps)[:7] == by_priority

    def option(step, name):
        return step.command[step.command.index(name) + 1]

    ours4 = steps["ours_4"]
    ours_defaults = importlib.import_module("scale_8b").parse_args([])
    for name in ("titan_causal_4", "titan_varlen_4"):
        titan = steps[name]
        assert "--nproc-per-node=4" in titan.command and "--nproc-per-node=4" in ours4.command  # the same 4 GPUs
        assert int(option(titan, "--training.seq_len")) == ours_defaults.tokens_per_batch == 8192
        assert option(titan, "--training.local_batch_size") == "1"  # one 8,192-token row per GPU per step, as ours
        assert option(titan, "--activation_checkpoint.mode") == "full" and ours_defaults.ac == "full"
        assert option(titan, "--training.dtype") == "bfloat16"  # bf16 weights and AdamW states, as ours on CUDA
        timed = int(option(titan, "--training.steps")) - results_of.TITAN_SKIP
        assert timed == int(option(ours4, "--steps")) == 12  # the same number of timed steps
        assert "--compile.enable" not in titan.command and "--compile" not in ours4.command
    assert option(steps["titan_varlen_4"], "--model.flavor") == "8B_varlen"  # the documents' boundaries
    assert option(steps["titan_causal_4"], "--model.flavor") == "8B"  # one causal sequence per row
    for name in ("ours_4", "ours_2", "ours_1"):  # every GPU count replays the same 4-rank plan
        assert option(steps[name], "--replicas") == "4"
    assert steps["ours_2"].env["CUDA_VISIBLE_DEVICES"] == "0,1" and steps["ours_1"].env["CUDA_VISIBLE_DEVICES"] == "0"
    assert (
        "--compile.enable" in steps["titan_varlen_4_compile"].command and "--compile" in steps["ours_4_compile"].command
    )
    keep, titan_keep = steps["ours_4_keep"], steps["titan_varlen_4_keep"]  # both sides keep the gathered parameters
    assert option(keep, "--reshard-after-forward") == "never" and ours_defaults.reshard_after_forward == "always"
    assert option(titan_keep, "--parallelism.fsdp_reshard_after_forward") == "never"
    assert option(titan_keep, "--model.flavor") == "8B_varlen" and option(keep, "--steps") == option(ours4, "--steps")


def test_local_batch_2_gives_both_sides_two_rows_a_gpu_and_its_own_scaling(tmp_path):
    steps = {s.name: s for s in plan.plan_steps(tmp_path)}

    def option(step, name):
        return step.command[step.command.index(name) + 1]

    for name in ("titan_varlen_4_lb2", "titan_causal_4_lb2", "titan_varlen_4_keep_lb2", "titan_varlen_4_compile_lb2"):
        assert option(steps[name], "--training.local_batch_size") == "2" and option(steps[name], "--training.seq_len") == "8192"
    for name in ("titan_varlen_4", "titan_causal_4"):
        assert option(steps[name], "--training.local_batch_size") == "1"
    for name in ("ours_4_lb2", "ours_2_lb2", "ours_1_lb2", "ours_4_keep_lb2", "ours_4_compile_lb2"):
        assert option(steps[name], "--tokens-per-batch") == "16384" and option(steps[name], "--replicas") == "4"
    for name in ("ours_4_lb4", "ours_1_lb4", "ours_4_keep_lb4"):  # two 16,384-token micro-batches per GPU
        assert option(steps[name], "--tokens-per-batch") == "16384" and option(steps[name], "--replicas") == "8"
        assert option(steps[name], "--examples") == "6000"  # the 4-GPU run and its 1-GPU replay draw the same
    assert "--tokens-per-batch" not in steps["ours_4"].command  # local batch 1: the 8,192-token default
    assert option(steps["ours_4_keep_lb2"], "--reshard-after-forward") == "never"
    assert option(steps["titan_varlen_4_keep_lb2"], "--parallelism.fsdp_reshard_after_forward") == "never"
    # MFU charges attention per 8,192-token document row on both sides, not over our 16,384-token packed row
    ours_args = importlib.import_module("scale_8b").parse_args(["--tokens-per-batch", "16384"])
    assert metrics.flops_row(ours_args) == 8192

    ours = {"status": "ok", "gpus": 4, "tokens_per_s_per_gpu": 7600.0, "mfu": 0.44, "mfu_causal_documents": 0.36,
            "peak_allocated_gib_per_gpu": [25.0], "compile": False, "loss": [12.0, 11.0], "card": "H100"}  # fmt: skip
    runs = {"ours_4": {**ours, "tokens_per_s_per_gpu": 7000.0, "step_seconds": [9.0, 2.0, 2.2, 2.1, 2.3]},
            "ours_1": {**ours, "gpus": 1, "tokens_per_s_per_gpu": 8000.0, "warmup": 1, "steps": 2,
                       "step_seconds": [11.0, 7.6, 8.4]},
            "ours_4_lb2": ours, "ours_1_lb2": {**ours, "gpus": 1, "tokens_per_s_per_gpu": 7900.0, "loss": [12.0, 11.001]}}  # fmt: skip
    results = results_of.build(runs)
    assert results["scaling"]["per_gpu_efficiency"]["ours_4"] == pytest.approx(7000 / 8000)
    # the same micro-batches (steps 1-2): 1 GPU 16.0 s, 4 GPUs 4.2 s each
    assert results["scaling"]["same_steps_efficiency"]["ours_4"] == pytest.approx(16.0 / (4 * 4.2))
    assert results["scaling_local_batch_2"]["per_gpu_efficiency"]["ours_4_lb2"] == pytest.approx(7600 / 7900)
    assert results["scaling_local_batch_2"]["same_steps_efficiency"]["ours_4_lb2"] is None  # no step times given
    assert results["loss_vs_replay"]["ours_1_lb2"]["reference"] == "ours_4_lb2"
    assert results["loss_vs_replay"]["ours_1_lb2"]["within_bf16_noise"]
    assert {r["local_batch"] for r in results["rows"] if r["ours"] == "ours_4_lb2"} == {2}
    assert "Per-GPU scaling, local batch 2" in report_of.markdown(results)


def test_the_two_gpu_diagnosis_replays_its_plan_and_profiles_an_untimed_step(tmp_path):
    steps = {s.name: s for s in plan.plan_steps(tmp_path)}

    def option(step, name):
        return step.command[step.command.index(name) + 1] if name in step.command else None

    bases = {compiled: steps["ours_1_r2_lb2" + "_compile" * compiled] for compiled in (False, True)}
    variants = [s for name, s in steps.items() if name.startswith("ours_2_r2_lb2")]
    assert len(variants) == 11 and all("--nproc-per-node=1" in base.command for base in bases.values())
    for step in [*bases.values(), *variants]:  # one 16,384-token micro-batch per GPU a step, as at 4 GPUs; 2 ranks
        assert (option(step, "--replicas"), option(step, "--tokens-per-batch")) == ("2", "16384")
        assert int(option(step, "--profile-step")) <= int(option(step, "--warmup"))  # the profiled step is not timed
        assert "--nproc-per-node=2" in step.command or step in bases.values()
    for step in variants:  # each compared with a replay compiled as it is, the same steps timed on both sides
        base = bases["--compile" in step.command]
        assert ("--compile" in base.command, option(base, "--warmup")) == ("--compile" in step.command,
                                                                           option(step, "--warmup"))
    compiled_as = {n: option(s, "--compile-as") for n, s in steps.items() if "--compile" in s.command and
                   n.startswith("ours_2_r2")}  # fmt: skip
    assert compiled_as == {"ours_2_r2_lb2_compile": None, "ours_2_r2_lb2_keep_bf16_reduce_compile": None,
                           "ours_2_r2_lb2_compile_dynamic": "module_dynamic", "ours_2_r2_lb2_compile_layers": "layers"}
    layers = {n: option(s, "--compile-layers") for n, s in steps.items() if n.startswith("ours_trainer_2_lb2_")}
    assert layers == {"ours_trainer_2_lb2_compile": "auto", "ours_trainer_2_lb2_eager": "false",
                      "ours_trainer_2_lb2_keep_compile": "auto"}
    assert option(steps["ours_trainer_2_lb2_keep_compile"], "--reshard-after-forward") == "never"
    options = {s.name: (option(s, "--reshard-after-forward"), option(s, "--reduce-dtype"), option(s, "--prefetch"),
                        s.env.get("NCCL_MAX_CTAS")) for s in variants}  # fmt: skip
    assert options["ours_2_r2_lb2"] == (None, None, None, None)  # FSDP2 as every 4-GPU row runs it
    assert options["ours_2_r2_lb2_keep_bf16_reduce"] == ("never", "bfloat16", None, None)
    assert options["ours_2_r2_lb2_keep_ctas8"] == ("never", None, None, "8")
    for name, gpus in (("ours_trainer_2_lb2", "2"), ("ours_trainer_1_lb2", "1"), ("ours_trainer_4_lb2", "4")):
        step = steps[name]  # PackingTrainer: one sampler rank per GPU, local batch 2
        assert option(step, "--runner") == "trainer" and option(step, "--replicas") == gpus
        assert f"--nproc-per-node={gpus}" in step.command and option(step, "--tokens-per-batch") == "16384"
    keep_bf16 = steps["ours_4_keep_bf16_reduce_lb2"]  # the 4-GPU run of what the diagnosis found
    assert (option(keep_bf16, "--replicas"), option(keep_bf16, "--reduce-dtype")) == ("4", "bfloat16")
    assert option(steps["ours_4_keep_bf16_reduce_lb4"], "--replicas") == option(steps["ours_1_lb4"], "--replicas")


def test_the_diagnosis_report_compares_each_variant_with_the_replay_over_the_same_steps():
    timed = {"gpus": 2, "warmup": 2, "steps": 3, "loss": [12.0, 11.5, 11.0, 10.8, 10.6], "reduce_dtype": "float32",
             "reshard_after_forward": "always", "prefetch": 0}  # fmt: skip
    profile = {"step": 2, "step_ms": 2300.0, "compute_ms": 2170.0, "comm_hidden_ms": 200.0, "comm_exposed_ms": 20.0,
               "idle_ms": 40.0}  # fmt: skip
    runs = {
        "ours_1_r2_lb2": {"status": "ok", "gpus": 1, "warmup": 2, "steps": 3, "tokens_per_s_per_gpu": 8500.0,
                          "step_seconds": [9.0, 6.0, 4.0, 4.0, 4.0], "loss": [12.0, 11.5, 11.0, 10.8, 10.6]},
        "ours_2_r2_lb2": {"status": "ok", **timed, "tokens_per_s_per_gpu": 7800.0,
                          "step_seconds": [9.0, 5.0, 2.2, 2.1, 2.2], "profile": profile},
        "ours_2_r2_lb2_keep": {"status": "ok", **timed, "reshard_after_forward": "never",
                               "tokens_per_s_per_gpu": 8000.0, "step_seconds": [9.0, 5.0, 2.1, 2.1, 2.1]},
        "ours_trainer_2_lb2": {"status": "ok", "gpus": 2, "tokens_per_s_per_gpu": 7878.0, "compile": False, "mfu": 0.46,
                               "peak_allocated_gib_per_gpu": [35.0], "loss": [12.0]},
        # a later machine's compiled runs: compared with its own compiled replay, the Trainer with itself eager
        "ours_1_r2_lb2_compile@c": {"status": "ok", "gpus": 1, "warmup": 2, "steps": 3, "compile": True,
                                    "tokens_per_s_per_gpu": 9000.0, "step_seconds": [9.0, 6.0, 3.6, 3.6, 3.6],
                                    "loss": [12.0, 11.5, 11.0, 10.8, 10.6]},
        "ours_2_r2_lb2_compile@c": {"status": "ok", **timed, "compile": True, "tokens_per_s_per_gpu": 8600.0,
                                    "step_seconds": [9.0, 5.0, 1.9, 1.9, 2.0]},
        "ours_trainer_2_lb2_compile@c": {"status": "ok", "gpus": 2, "tokens_per_s_per_gpu": 8700.0, "compile": True,
                                         "mfu": 0.5, "peak_allocated_gib_per_gpu": [35.0], "loss": [12.0]},
        "ours_trainer_2_lb2_eager@c": {"status": "ok", "gpus": 2, "tokens_per_s_per_gpu": 7700.0, "compile": False,
                                       "mfu": 0.45, "peak_allocated_gib_per_gpu": [35.0], "loss": [12.0]},
    }  # fmt: skip
    two = results_of.build(runs)["two_gpus_local_batch_2"]
    compiled = two["runs"]["ours_2_r2_lb2_compile@c"]
    assert (compiled["base"], two["runs"]["ours_2_r2_lb2"]["base"]) == ("ours_1_r2_lb2_compile@c", "ours_1_r2_lb2")
    assert compiled["same_steps_efficiency"] == pytest.approx(10.8 / (2 * 5.8))
    assert two["trainer_vs_loop"]["ours_trainer_2_lb2_compile@c"] == pytest.approx(8700 / 8600)
    assert two["trainer_compiled_vs_eager"] == {"ours_trainer_2_lb2_compile@c": pytest.approx(8700 / 7700)}
    assert two["runs"]["ours_2_r2_lb2"]["same_steps_efficiency"] == pytest.approx(12.0 / (2 * 6.5))
    assert two["runs"]["ours_2_r2_lb2_keep"]["same_steps_efficiency"] == pytest.approx(12.0 / (2 * 6.3))
    assert two["runs"]["ours_2_r2_lb2_keep"]["options"]["reshard_after_forward"] == "never"
    assert two["trainer_vs_loop"]["ours_trainer_2_lb2"] == pytest.approx(7878 / 7800)
    assert two["runs"]["ours_2_r2_lb2"]["exposed_ms_per_rank"] == [20.0]
    lines = report_of.markdown(results_of.build(runs))
    assert "compute 2,170, communication hidden 200 / exposed 20, idle 40" in lines
    assert "efficiency 0.918 / 0.923" in lines  # 7,800 / 8,500 over its own steps; 12 / 13 over the same


def test_a_later_machines_runs_compare_with_the_first_machines_base_under_their_own_names():
    base = {"status": "ok", "gpus": 1, "warmup": 1, "steps": 2, "step_seconds": [9.0, 4.0, 4.0],
            "tokens_per_s_per_gpu": 8000.0, "loss": [12.0, 11.0]}  # fmt: skip
    two = {"status": "ok", "gpus": 2, "warmup": 1, "steps": 2, "tokens_per_s_per_gpu": 7700.0, "loss": [12.0, 11.0]}
    first = {"ours_1_r2_lb2": base, "ours_2_r2_lb2": {**two, "step_seconds": [5.0, 2.2, 2.2]}}
    second = {"ours_2_r2_lb2": {**two, "step_seconds": [5.0, 2.0, 2.0]},
              "ours_trainer_2_lb2": {"status": "ok", "gpus": 2, "tokens_per_s_per_gpu": 7800.0, "mfu": 0.4,
                                     "compile": False, "peak_allocated_gib_per_gpu": [35.0], "loss": [12.0]}}  # fmt: skip
    two_gpus = results_of.build(results_of.merge_folders({"a": first, "b": second}))["two_gpus_local_batch_2"]
    assert two_gpus["runs"]["ours_2_r2_lb2@b"]["same_steps_efficiency"] == pytest.approx(8.0 / (2 * 4.0))
    assert two_gpus["runs"]["ours_2_r2_lb2"]["same_steps_efficiency"] == pytest.approx(8.0 / (2 * 4.4))
    # the Trainer against the loop of its own machine, not the first machine's
    assert two_gpus["trainer_vs_loop"] == {"ours_trainer_2_lb2@b": pytest.approx(7800 / 7700)}


@pytest.mark.parametrize(("option", "message"), [(["--profile-step", "0"], "profile one of the 1 untimed steps"),
                                                 (["--prefetch", "-1"], "give 0")])
def test_a_profiled_timed_step_and_a_negative_prefetch_are_refused(option, message, tmp_path):
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}  # fmt: skip
    code, stdout, stderr = preloaded_run([str(SCRIPT), "--smoke", "--warmup", "1", "--out", str(tmp_path), *option],
                                         env=env, timeout=120)  # fmt: skip
    assert code != 0 and message in stdout + stderr


def test_only_runs_the_named_steps_in_the_order_named(tmp_path):
    # a device call names what matters first: the deadline skips the last ones, not the first (a call once ran its
    # second-named Trainer run first, in the plan's order, and the deadline skipped the one it was for)
    runs = plan.run_plan(tmp_path, 120, smoke=True, only=["titan030_import", "env"])
    assert [name for name in runs if name != "commit"] == ["titan030_import", "env"]
    assert all(runs[name]["status"] == "ok" for name in ("titan030_import", "env"))


def test_the_compiled_scaling_at_four_gpus_is_against_the_compiled_replay():
    def ours(gpus, rate, seconds):
        return {"status": "ok", "gpus": gpus, "tokens_per_s_per_gpu": rate, "warmup": 1, "steps": 2, "compile": True,
                "step_seconds": seconds, "mfu": 0.5, "peak_allocated_gib_per_gpu": [30.0], "loss": [12.0, 11.0]}

    runs = {"ours_1_compile_lb2": ours(1, 10000.0, [9.0, 8.0, 8.0]),
            "ours_4_keep_bf16_reduce_compile_lb2": ours(4, 9600.0, [5.0, 2.1, 2.1, 2.0]),
            "ours_4_lb2": {**ours(4, 7600.0, [5.0, 2.5, 2.5]), "compile": False}}  # fmt: skip
    results = results_of.build(runs)
    compiled = results["scaling_local_batch_2_compiled"]
    assert compiled["base"] == "ours_1_compile_lb2" and "ours_4_lb2" not in compiled["runs"]
    assert compiled["same_steps_efficiency"]["ours_4_keep_bf16_reduce_compile_lb2"] == pytest.approx(16.0 / (4 * 4.2))
    assert results["scaling_local_batch_2"]["base"] == "ours_4_lb2"  # the eager runs keep their own base
    settings = [r["setting"] for r in results["rows"]]
    assert any("torch.compile per layer, gathered parameters kept" in s for s in settings)
    # a row of ours beside a torchtitan run shown elsewhere appears only where ours ran
    steps = [{"tps": 7800.0, "mfu_pct": 45.0, "memory_gib": 60.0, "loss": 12.0} for _ in range(15)]
    titan = {"status": "ok", "flavor": "8B_varlen", "steps": steps, "data": {"documents": [100] * 82}}
    rows = results_of.build({"titan_varlen_4_keep_lb2": titan})["rows"]
    assert [r["ours"] for r in rows] == [None] and "bf16" not in rows[0]["setting"]  # torchtitan's own row, once


def test_four_gpu_rows_and_scaling_compare_within_each_machine_of_a_merged_folder():
    def ours(gpus: int, rate: float, seconds: list, compile_: bool = False, loss: float = 12.0) -> dict:
        return {"status": "ok", "gpus": gpus, "warmup": 1, "steps": 2, "tokens_per_s_per_gpu": rate,
                "compile": compile_, "mfu": 0.5, "peak_allocated_gib_per_gpu": [20.0], "step_seconds": seconds,
                "loss": [loss, loss - 0.5, loss - 1.0]}  # fmt: skip

    titan = lambda tps: {"status": "ok", "steps": [{"tps": tps, "loss": 12.0, "mfu_pct": 40.0, "memory_gib": 30.0}  # noqa: E731
                                                   for _ in range(6)]}  # fmt: skip
    first = {"ours_1_compile_lb2": ours(1, 1000.0, [9.0, 8.0, 8.0], True),
             "ours_4_compile_lb2": ours(4, 950.0, [5.0, 2.1, 2.1], True, loss=12.001),
             "titan_varlen_4_compile_lb2": titan(900.0),
             # the Trainer: a slow step 1 (its one-off work), then the loop's pace
             "ours_trainer_4_lb2": {**ours(4, 940.0, [None, 3.0, 2.1], True, loss=12.3), "warmup": 2}}  # fmt: skip
    second = {"ours_4_lb2": ours(4, 800.0, [5.0, 2.0, 2.0]), "titan_varlen_4_lb2": titan(810.0),
              "ours_1_lb2": ours(1, 850.0, [9.0, 7.6, 7.6], loss=11.0)}  # fmt: skip
    results = results_of.build(results_of.merge_folders({"a": first, "b": second}))
    rows = {(r["ours"], r["torchtitan"]): r for r in results["rows"]}
    # each 4-GPU run beside torchtitan's run of its own machine, marked with that machine
    assert rows[("ours_4_compile_lb2", "titan_varlen_4_compile_lb2")]["ours_vs_torchtitan"] == pytest.approx(950 / 900)
    assert rows[("ours_4_lb2@b", "titan_varlen_4_lb2@b")]["ours_vs_torchtitan"] == pytest.approx(800 / 810)
    assert rows[("ours_4_lb2@b", "titan_varlen_4_lb2@b")]["machine"] == "b"
    assert not any(r["torchtitan"] and "causal" in r["torchtitan"] for r in results["rows"])  # not run: no row
    # the scaling of each machine against its own 1-GPU replay
    assert results["scaling_local_batch_2_compiled"]["same_steps_efficiency"]["ours_4_compile_lb2"] == pytest.approx(
        16.0 / (4 * 4.2))
    later = results["machines"]["b"]["scaling_local_batch_2"]
    assert later["base"] == "ours_1_lb2@b" and later["same_steps_efficiency"]["ours_4_lb2@b"] == pytest.approx(
        15.2 / (4 * 4.0))
    assert results["scaling_local_batch_2"]["runs"] == {}  # the first machine ran no eager run
    # losses against the replay, compiled apart from eager: a differing replay is flagged on its own machine
    assert results["loss_vs_replay"]["ours_1_compile_lb2"]["within_bf16_noise"]
    assert not results["loss_vs_replay"]["ours_1_lb2@b"]["within_bf16_noise"]  # 1.0 / 12 > 2%
    compiled = results["scaling_local_batch_2_compiled"]
    assert compiled["same_steps_efficiency"]["ours_trainer_4_lb2"] == pytest.approx(16.0 / (4 * 5.1))
    assert compiled["same_steps_after_warm_up_efficiency"]["ours_trainer_4_lb2"] == pytest.approx(8.0 / (4 * 2.1))
    assert rows[("ours_trainer_4_lb2", None)]["comparison"].endswith("ours_4_compile_lb2, 0.989x)")  # 940 / 950
    trainer_losses = results["loss_vs_replay"]["ours_1_compile_lb2:ours_trainer_4_lb2"]  # 0.3 / 12: beyond 2%
    assert trainer_losses["reference"] == "ours_trainer_4_lb2" and not trainer_losses["within_bf16_noise"]
    table = report_of.markdown(results)
    assert "eager [b] | 4 | 800 | 810 | 0.99 |" in table
    assert "Per-GPU scaling [b], local batch 2 " in table and "NOT within" in table


def test_torchtitans_keep_and_norm_settings_have_rows_of_ours_beside_them():
    run = lambda rate, loss=12.0, **kw: {"status": "ok", "gpus": 4, "warmup": 1, "steps": 2, "mfu": 0.5,  # noqa: E731
                                         "tokens_per_s_per_gpu": rate, "peak_allocated_gib_per_gpu": [20.0],
                                         "step_seconds": [5.0, 2.0, 2.0], "loss": [loss, loss - 0.5], "compile": False, **kw}
    titan = lambda tps: {"status": "ok", "steps": [{"tps": tps, "loss": 12.0, "mfu_pct": 40.0, "memory_gib": 30.0}  # noqa: E731
                                                   for _ in range(6)]}  # fmt: skip
    runs = {"ours_4_keep_compile_lb2": run(960.0, compile=True), "titan_varlen_4_keep_compile_lb2": titan(900.0),
            "ours_4_keep_bf16_reduce_compile_lb2": run(990.0, compile=True), "ours_4_lb2": run(800.0),
            "ours_4_torch_norm_lb2": run(850.0, loss=12.5), "titan_varlen_4_lb2": titan(810.0),
            "ours_1_lb2": {**run(860.0), "gpus": 1}}  # fmt: skip
    results = results_of.build(runs)
    rows = {(r["ours"], r["torchtitan"]): r for r in results["rows"]}
    assert rows[("ours_4_keep_compile_lb2", "titan_varlen_4_keep_compile_lb2")]["ours_vs_torchtitan"] == pytest.approx(
        960 / 900)
    assert rows[("ours_4_torch_norm_lb2", "titan_varlen_4_lb2")]["ours_vs_torchtitan"] == pytest.approx(850 / 810)
    assert "fused" in rows[("ours_4_torch_norm_lb2", "titan_varlen_4_lb2")]["setting"]
    # the norm's losses are checked against the replay too: 0.5 / 12 is not bf16 noise
    assert not results["loss_vs_replay"]["ours_1_lb2:ours_4_torch_norm_lb2"]["within_bf16_noise"]
    assert "ours_4_keep_compile_lb2" in results["scaling_local_batch_2_compiled"]["runs"]


def test_rms_norm_torch_swaps_every_norm_of_the_model_for_the_fused_call(monkeypatch):
    scale = importlib.import_module("scale_8b")
    import torch

    args = scale.parse_args(["--smoke", "--rms-norm", "torch"])
    model = scale.build_model(args, torch.device("cpu"), torch.float32)
    reference = scale.build_model(scale.parse_args(["--smoke"]), torch.device("cpu"), torch.float32)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all(m.forward.__func__.__module__ == "_fused_norm" for m in norms)
    ids = torch.randint(0, 200, (1, 32))
    torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    # a model with no norm to swap is refused, not timed as if its norm were fused
    monkeypatch.setattr(importlib.import_module("_fused_norm"), "torch_rms_norm", lambda model: 0)
    with pytest.raises(SystemExit, match="no RMSNorm with variance_epsilon"):
        scale.build_model(args, torch.device("cpu"), torch.float32)
