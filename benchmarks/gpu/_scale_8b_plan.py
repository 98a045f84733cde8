"""scale_8b.py --plan and --report: the device call's steps, each under a timeout, and the files it leaves in $OUT.

    --plan   runs plan_steps() in order (one torchrun each, its output to the console and to <work>/<name>.log), skips a
             step the deadline leaves too little time for (its ``expected`` seconds), and after every step rewrites
             $OUT: results.json, report.md, runs.log (every step's output), env.txt. A device call returns at most
             8 files, so the runs' own files stay in <work> (/tmp/scale8b) and results.json carries them ("runs").
    --report rebuilds results.json and report.md from a results.json's "runs" (or a folder of <name>.json runs).

The rows, scaling and loss checks: ``_scale_8b_results.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from _scale_8b_metrics import parse_titan_log
from _scale_8b_report import markdown
from _scale_8b_results import SEQ, TITAN_SKIP, build, merge_folders

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORK = Path("/tmp/scale8b")
TITAN_STEPS = 15  # torchtitan's steps; the first TITAN_SKIP are left out (compiles, first all-gathers)


@dataclass
class Step:
    name: str
    command: list[str]
    expected: float  # seconds it should take; skipped when the deadline leaves less
    timeout: float
    env: dict = field(default_factory=dict)
    kind: str = "ours"  # ours | titan | shell


def torchrun(gpus: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]


TITAN_030_CHECK = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tt030 .ttwhl/v030/*.whl && "
    "PYTHONPATH=/tmp/tt030:$PYTHONPATH python3 -c \"import sys, types; m = types.ModuleType('torch.utils.tensorboard'); "
    "m.SummaryWriter = None; sys.modules['torch.utils.tensorboard'] = m; import torch, torchtitan, torchtitan.trainer; "
    "print('torchtitan', torchtitan.__version__, 'imports on torch', torch.__version__)\""
)
ENV = ("nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv; python3 -c 'import torch, "
       "transformers; print(torch.__version__, transformers.__version__)'; python3 -m pip list 2>/dev/null | grep -iE "
       "'torch|transformers|accelerate|flash|cutlass|tyro|datasets'")  # fmt: skip


def fa4_installed() -> bool:
    """Whether FlashAttention-4 (flash_attn.cute) is importable; without it our runs take torch's varlen kernel."""
    import importlib.util

    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except ModuleNotFoundError:
        return False


def plan_steps(work: Path, smoke: bool = False, fa4_disk_cache: bool = False) -> list[Step]:
    """The device call's steps in order; ``smoke``: the same driver on the CPU (2 gloo processes for 4 GPUs, 1 for 2
    and 1, tiny models, torchtitan's debug model under DDP), the rehearsal the CPU test runs. ``fa4_disk_cache``: our
    runs share FA4's compiled kernels through its on-disk cache (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED): the later
    runs skip the ~25 s of warm-up compiles (measured on 2x H200; scale_8b.py's docstring)."""
    big, half = (2, 1) if smoke else (4, 2)
    seq = 256 if smoke else SEQ
    titan_common = [
        "--training.seq_len", str(seq),
        "--training.steps", str(5 if smoke else TITAN_STEPS),
        "--training.dtype", "float32" if smoke else "bfloat16",
        "--training.mixed_precision_param", "float32" if smoke else "bfloat16",
        "--activation_checkpoint.mode", "full", "--metrics.log_freq", "1", "--metrics.disable_color_printing",
        "--optimizer.lr", "1e-4", "--lr_scheduler.warmup_steps", "1", "--debug.seed", "0",
        "--job.dump_folder", str(work / "titan_dump"),
    ]  # fmt: skip
    if smoke:  # gloo has no PREMUL_SUM, which FSDP's reduction uses there: DDP on the CPU
        titan_common += ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.data_parallel_replicate_degree",
                         str(big)]  # fmt: skip
    titan_data = ["--cpu", "--data-examples", "300", "--data-max-length", "512"] if smoke else []
    ours_extra = ["--smoke"] if smoke else ([] if fa4_installed() else ["--attn", "packing_varlen"])

    def titan(name: str, flavor: str, *extra: str, expected: float = 90, timeout: float = 170, batch: int = 1) -> Step:
        command = [*torchrun(big), "--local-ranks-filter", "0", "--role", "rank", "--tee", "3",
                   str(HERE / "_scale_8b_titan.py"), *titan_data, "--data-stats", str(work / f"{name}_data.json"),
                   "--model.flavor", "debugmodel" if smoke else flavor, *titan_common,
                   "--training.local_batch_size", str(batch), *extra]  # fmt: skip
        return Step(name, command, expected, timeout, kind="titan")

    cache = {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(work / "fa4")}

    def ours(name: str, gpus: int, steps: int, warmup: int, *extra: str, expected: float, timeout: float,
             batch: int = 1, replicas: int | None = None, nccl: dict | None = None) -> Step:
        # local batch 2: one packed row of 2 x 8,192 tokens; 4: two such micro-batches per GPU (8 sampler ranks)
        rows = [] if batch == 1 else ["--tokens-per-batch", str(min(batch, 2) * (1024 if smoke else SEQ))]
        ranks = str(replicas or big * max(1, batch // 2))
        rows += ["--examples", "6000"] if batch == 4 and not smoke else []  # enough documents for 10 such steps
        command = [*torchrun(gpus), str(HERE / "scale_8b.py"), "--name", name, "--out", str(work), "--replicas",
                   ranks, "--steps", str(steps), "--warmup", str(warmup), *ours_extra, *rows, *extra]  # fmt: skip
        env = {} if smoke else {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(gpus))}
        if gpus == 1 and not smoke:  # 8B with bf16 AdamW states on one 80 GB card: ~64 GB before activations
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        return Step(name, command, expected, timeout, env={**env, **(cache if fa4_disk_cache else {}), **(nccl or {})})

    def trainer(name: str, gpus: int, steps: int = 8, warmup: int = 2, batch: int = 2, *extra: str) -> Step:
        rows = [] if batch == 1 else ["--tokens-per-batch", str(batch * (1024 if smoke else SEQ))]  # a rank per GPU
        command = [*torchrun(gpus), str(HERE / "scale_8b.py"), "--runner", "trainer", "--name", name, "--out",
                   str(work), "--replicas", str(gpus), "--steps", str(steps), "--warmup", str(warmup), *rows,
                   *ours_extra, *extra]  # fmt: skip
        env = {} if smoke else {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(gpus))}
        if gpus == 1 and not smoke:  # as ours_1: 8B with its AdamW states on one card
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        return Step(name, command, 110 + 10 * steps, 200 + 10 * steps, env={**env, **(cache if fa4_disk_cache else {})})

    shell = (lambda c: ["bash", "-c", "echo smoke"]) if smoke else (lambda c: ["bash", "-c", c])
    return [
        Step("env", shell(ENV), 10, 60, kind="shell"),
        titan("titan_causal_4", "8B", expected=80),
        ours("ours_4", big, 12, 3, expected=100, timeout=200),
        ours("ours_2", half, 6, 2, expected=70, timeout=150),
        titan("titan_varlen_4", "8B_varlen", expected=90),
        ours("ours_1", 1, 3, 1, expected=70, timeout=150),
        Step("titan030_import", shell(TITAN_030_CHECK), 20, 60, kind="shell"),  # evidence, if time is left
        ours("ours_4_compile", big, 12, 3, "--compile", expected=150, timeout=240),
        titan("titan_varlen_4_compile", "8B_varlen", "--compile.enable", expected=150, timeout=240),
        trainer("ours_trainer_4", big, steps=12, warmup=3, batch=1),
        # both sides keep the gathered parameters from forward to backward (torchtitan's fsdp_reshard_after_forward)
        ours("ours_4_keep", big, 12, 3, "--reshard-after-forward", "never", expected=100, timeout=200),
        titan("titan_varlen_4_keep", "8B_varlen", "--parallelism.fsdp_reshard_after_forward", "never", expected=90),
        ours("ours_2_keep", half, 6, 2, "--reshard-after-forward", "never", expected=70, timeout=150),
        # local batch 2 (torchtitan's published setting): twice the tokens per FSDP gather and reduction
        ours("ours_4_lb2", big, 12, 3, expected=130, timeout=240, batch=2),
        titan("titan_varlen_4_lb2", "8B_varlen", expected=120, timeout=220, batch=2),
        ours("ours_1_lb2", 1, 3, 2, expected=120, timeout=210, batch=2),
        ours("ours_2_lb2", half, 6, 2, expected=100, timeout=200, batch=2),
        titan("titan_causal_4_lb2", "8B", expected=110, timeout=220, batch=2),
        ours("ours_4_keep_lb2", big, 12, 3, "--reshard-after-forward", "never", expected=130, timeout=240, batch=2),
        titan("titan_varlen_4_keep_lb2", "8B_varlen", "--parallelism.fsdp_reshard_after_forward", "never",
              expected=120, timeout=220, batch=2),
        ours("ours_4_compile_lb2", big, 12, 3, "--compile", expected=170, timeout=260, batch=2),
        titan("titan_varlen_4_compile_lb2", "8B_varlen", "--compile.enable", expected=170, timeout=260, batch=2),
        # where 2 GPUs lose time against 1 (a 2-GPU machine): the 2-rank plan at local batch 2, one micro-batch per
        # GPU a step as at 4 GPUs, its 1-GPU replay, FSDP2's options one at a time, each profiled at an untimed step
        ours("ours_1_r2_lb2", 1, 3, 2, "--profile-step", "2", expected=80, timeout=200, batch=2, replicas=half),
        ours("ours_2_r2_lb2", half, 8, 2, "--profile-step", "2", expected=75, timeout=180, batch=2, replicas=half),
        ours("ours_2_r2_lb2_keep", half, 8, 2, "--reshard-after-forward", "never", "--profile-step", "2", expected=75,
             timeout=180, batch=2, replicas=half),
        ours("ours_2_r2_lb2_bf16_reduce", half, 8, 2, "--reduce-dtype", "bfloat16", "--profile-step", "2",
             expected=75, timeout=180, batch=2, replicas=half),
        ours("ours_2_r2_lb2_prefetch2", half, 8, 2, "--prefetch", "2", "--profile-step", "2", expected=75,
             timeout=180, batch=2, replicas=half),
        ours("ours_2_r2_lb2_keep_bf16_reduce", half, 8, 2, "--reshard-after-forward", "never", "--reduce-dtype",
             "bfloat16", "--profile-step", "2", expected=75, timeout=180, batch=2, replicas=half),
        # NCCL's kernels on at most 8 SMs (of 132): less taken from the matmuls they run beside, slower collectives
        ours("ours_2_r2_lb2_ctas8", half, 8, 2, "--profile-step", "2", expected=75, timeout=180, batch=2,
             replicas=half, nccl={"NCCL_MAX_CTAS": "8"}),
        ours("ours_2_r2_lb2_keep_ctas8", half, 8, 2, "--reshard-after-forward", "never", "--profile-step", "2",
             expected=75, timeout=180, batch=2, replicas=half, nccl={"NCCL_MAX_CTAS": "8"}),
        trainer("ours_trainer_2_lb2", half),
        # PackingTrainer against our loop on one GPU (no FSDP; the Trainer's gradient checkpointing)
        ours("ours_1_r1_lb2", 1, 6, 2, expected=80, timeout=200, batch=2, replicas=1),
        trainer("ours_trainer_1_lb2", 1, steps=6),
        # what the 2-GPU diagnosis found (scale_8b_h200x2_diag/): keep the gathered parameters and reduce gradients in
        # bf16 (accelerate's FSDP2 default on bf16 weights, so PackingTrainer's; torchtitan 0.2.2 reduces in float32
        # only), at 4 GPUs, local batch 2 and 4; the Trainer at local batch 2 (the plan of ours_4_lb2 and ours_1_lb2)
        ours("ours_4_keep_bf16_reduce_lb2", big, 12, 3, "--reshard-after-forward", "never", "--reduce-dtype",
             "bfloat16", expected=130, timeout=240, batch=2),
        trainer("ours_trainer_4_lb2", big, steps=12, warmup=3),
        ours("ours_4_keep_bf16_reduce_lb4", big, 8, 2, "--reshard-after-forward", "never", "--reduce-dtype",
             "bfloat16", expected=130, timeout=240, batch=4),
        # compiled on 2 GPUs: our loop (each layer torch.compile'd) against its compiled 1-GPU replay, and
        # PackingTrainer, whose compile_layers="auto" now compiles the layers under accelerate's FSDP2 too, against
        # itself eager (compile_layers=False) and against our compiled loop
        ours("ours_1_r2_lb2_compile", 1, 3, 2, "--compile", "--profile-step", "2", expected=120, timeout=240,
             batch=2, replicas=half),
        ours("ours_2_r2_lb2_compile", half, 8, 2, "--compile", "--profile-step", "2", expected=110, timeout=220,
             batch=2, replicas=half),
        trainer("ours_trainer_2_lb2_compile", half, 8, 2, 2, "--compile-layers", "auto"),
        # what separates the compiled Trainer from our compiled loop: the loop with the row length symbolic, then
        # compiled as the Trainer compiles (each layer's forward, the checkpoint in its graph, dynamic shapes)
        ours("ours_2_r2_lb2_compile_dynamic", half, 8, 2, "--compile", "--compile-as", "module_dynamic", "--profile-step",
             "2", expected=110, timeout=220, batch=2, replicas=half),
        ours("ours_2_r2_lb2_compile_layers", half, 8, 2, "--compile", "--compile-as", "layers", "--profile-step", "2",
             expected=110, timeout=220, batch=2, replicas=half),
        trainer("ours_trainer_2_lb2_eager", half, 8, 2, 2, "--compile-layers", "false"),
        # the Trainer keeping each layer's gathered parameters (fsdp_config reshard_after_forward=False; it reduces
        # in bf16 by accelerate's default): its scaling against the compiled replay, as a user configures it
        trainer("ours_trainer_2_lb2_keep_compile", half, 8, 2, 2, "--compile-layers", "auto", "--reshard-after-forward",
                "never"),
        ours("ours_2_r2_lb2_keep_bf16_reduce_compile", half, 8, 2, "--reshard-after-forward", "never",
             "--reduce-dtype", "bfloat16", "--compile", "--profile-step", "2", expected=110, timeout=220, batch=2,
             replicas=half),
        # compiled at 4 GPUs, local batch 2: both FSDP2 options (0.955 on 2 GPUs, compiled) against the compiled replay
        ours("ours_4_keep_bf16_reduce_compile_lb2", big, 12, 3, "--reshard-after-forward", "never", "--reduce-dtype",
             "bfloat16", "--compile", expected=170, timeout=260, batch=2),
        ours("ours_1_compile_lb2", 1, 3, 2, "--compile", expected=160, timeout=270, batch=2),
        # what 4x H200 left (scale_8b_h200x4/): torchtitan compiled keeping the gathered parameters, beside ours with
        # both options; the Trainer keeping them (fsdp_config reshard_after_forward=False), against the compiled replay
        titan("titan_varlen_4_keep_compile_lb2", "8B_varlen", "--parallelism.fsdp_reshard_after_forward", "never",
              "--compile.enable", expected=170, timeout=260, batch=2),
        trainer("ours_trainer_4_lb2_keep_compile", big, 12, 3, 2, "--compile-layers", "auto", "--reshard-after-forward",
                "never"),
        # ours with torchtitan's setting exactly (its gradients reduced in float32) beside titan_varlen_4_keep_compile_lb2;
        # eager with torchtitan's RMSNorm kernel (torch's fused rms_norm, _fused_norm.py) beside titan_varlen_4_lb2
        ours("ours_4_keep_compile_lb2", big, 12, 3, "--reshard-after-forward", "never", "--compile", expected=170,
             timeout=260, batch=2),
        ours("ours_4_torch_norm_lb2", big, 12, 3, "--rms-norm", "torch", expected=130, timeout=240, batch=2),
        # local batch 4: two 16,384-token micro-batches per GPU, gradients reduced once a step
        ours("ours_4_keep_lb4", big, 8, 2, "--reshard-after-forward", "never", expected=130, timeout=240, batch=4),
        ours("ours_1_lb4", 1, 3, 2, expected=165, timeout=255, batch=4),
        ours("ours_4_lb4", big, 8, 2, expected=130, timeout=240, batch=4),
    ]


# ----------------------------------------------------------------------------- running
def run_step(step: Step, work: Path, timeout: float) -> tuple[int | None, float]:
    """Run ``step`` (its own process group), tee its output to <work>/<name>.log; (exit code or None on timeout, s)."""
    started = time.perf_counter()
    env = {
        **os.environ,
        **step.env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with (work / f"{step.name}.log").open("w") as log:
        proc = subprocess.Popen(step.command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)  # fmt: skip
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        for line in proc.stdout:
            log.write(line)
            sys.stdout.write(f"[{step.name}] {line}")
        proc.wait()
        timer.cancel()
    return (None if timed_out.is_set() else proc.returncode), time.perf_counter() - started


def run_plan(out: Path, deadline_s: float, smoke: bool = False, fa4_disk_cache: bool = False,
             only: list[str] | None = None) -> dict:
    """Run the steps that fit the deadline (``only``: those named, in the order named); rewrite $OUT's files
    after each; the runs' records."""
    began = time.perf_counter()
    work = out / "work" if smoke else WORK
    steps = plan_steps(work, smoke, fa4_disk_cache)
    unknown = set(only or ()) - {step.name for step in steps}
    if unknown:
        raise SystemExit(f"--only: no step named {sorted(unknown)}; the plan's: {[step.name for step in steps]}")
    named = {step.name: step for step in steps}  # a call runs what it names first first (the deadline skips the rest)
    steps = steps if only is None else [named[name] for name in dict.fromkeys(only)]
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    status: dict[str, dict] = {"commit": {"status": "info", "output": _commit()}}
    runs: dict = {}
    for step in steps:
        left = deadline_s - (time.perf_counter() - began)
        if left < step.expected:
            status[step.name] = {"status": "skipped", "why": f"{left:.0f} s left, expected {step.expected:.0f} s"}
            print(f"== {step.name}: skipped ({status[step.name]['why']})", flush=True)
            continue
        print(f"== {step.name} ({left:.0f} s left): {' '.join(step.command)}", flush=True)
        code, seconds = run_step(step, work, min(step.timeout, left))
        state = "ok" if code == 0 else ("timeout" if code is None else f"exit {code}")
        status[step.name] = {"status": state, "seconds": round(seconds, 1), "command": " ".join(step.command)}
        print(f"== {step.name}: {state} in {seconds:.0f} s", flush=True)
        runs = collect(work, steps, status)
        write_outputs(out, work, steps, runs)
    runs = collect(work, steps, status)
    write_outputs(out, work, steps, runs)
    print(f"== plan done in {time.perf_counter() - began:.0f} s", flush=True)
    return runs


def _commit() -> str | None:
    """The checkout's commit, where the working tree came with its .git (the device's copy may not)."""
    try:
        return (
            subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
            or None
        )
    except OSError:
        return None


def collect(work: Path, steps: list[Step], status: dict) -> dict:
    """Every step's record: ours from <name>.json, torchtitan's from its log (+ <name>_data.json), shell output."""
    runs = {"commit": status.get("commit", {"status": "info", "output": None})}
    for step in steps:
        record = dict(status.get(step.name, {"status": "not run"}))
        log = work / f"{step.name}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        if step.kind == "ours" and (work / f"{step.name}.json").exists():
            record.update(json.loads((work / f"{step.name}.json").read_text()))
        elif step.kind == "titan":
            record.update(parse_titan_log(text), flavor=step.command[step.command.index("--model.flavor") + 1])
            record["compile"] = "--compile.enable" in step.command
            data = work / f"{step.name}_data.json"
            if data.exists():
                record["data"] = json.loads(data.read_text())
        elif step.kind == "shell":
            record["output"] = text[-4000:]
        if record["status"] not in ("ok", "not run", "skipped"):
            record["output_tail"] = text[-3000:]
        runs[step.name] = record
    return runs


def write_outputs(out: Path, work: Path, steps: list[Step], runs: dict) -> None:
    """results.json, report.md, runs.log (every step's output) and env.txt: at most 4 files, as the device allows 8."""
    results = build(runs)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(markdown(results))
    with (out / "runs.log").open("w") as log:
        for step in steps:
            path = work / f"{step.name}.log"
            if path.exists():
                text = path.read_text(errors="replace")
                log.write(f"\n===== {step.name} ({len(text)} chars; the last 400,000)\n{text[-400_000:]}")
    env = runs.get("env", {}).get("output")
    if env:
        (out / "env.txt").write_text(env + "\n\n" + runs.get("titan030_import", {}).get("output", ""))


def main(args) -> None:
    if args.plan:
        if args.out is None:
            raise SystemExit("--plan needs --out (the device's $OUT)")
        only = args.only.split(",") if args.only else None
        run_plan(args.out, args.deadline_s, smoke=args.smoke, fa4_disk_cache=args.fa4_disk_cache, only=only)
        return
    source, calls = args.report / "results.json", sorted(args.report.glob("*/results.json"))
    if calls:  # one folder per device call (machine): merged, the later ones' runs named <name>@<folder>
        runs = merge_folders({p.parent.name: json.loads(p.read_text())["runs"] for p in calls})
    elif source.exists():
        runs = json.loads(source.read_text())["runs"]
    else:
        runs = {p.stem: {"status": "ok", **json.loads(p.read_text())} for p in sorted(args.report.glob("*.json"))}
    results = build(runs)
    (args.report / "results.json").write_text(json.dumps(results, indent=1))
    (args.report / "report.md").write_text(markdown(results))
    print(markdown(results))
