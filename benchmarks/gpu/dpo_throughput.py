"""Packed preference training against TRL's padded DPOTrainer on one GPU (issue #44, item 4): tokens/s and memory.

    python benchmarks/gpu/dpo_throughput.py --all --mix short_prompt,long_prompt --out DIR   # every run below
    python benchmarks/gpu/dpo_throughput.py --setting packed --mix long_prompt --out DIR     # one run, this process
    python benchmarks/gpu/dpo_throughput.py --compare --out DIR      # DIR/results.json and DIR/README.md (no torch)
    python benchmarks/gpu/dpo_throughput.py --all --smoke --out /tmp/dpo                     # the CPU check, seconds

On the device, one H100: FA4 as ../shared/gpu/fa4-wheels.sh stages it (call 1 carries [".fa4a"]: ``mkdir -p
/tmp/fa4 && cp .fa4a/* /tmp/fa4/``), then call 2 carries [".fa4b", ".trlwhl"] (TRL 1.16 + datasets wheels:
``bash benchmarks/gpu/vs_trl_wheels.sh`` here) and runs::

    source .fa4b/install.sh && pip install --no-index --no-deps --target /tmp/trl .trlwhl/*.whl && export PYTHONPATH=/tmp/trl:$PYTHONPATH && python3 benchmarks/gpu/dpo_throughput.py --all --mix short_prompt,long_prompt --out /tmp/dpo; tar czf $OUT/dpo.tgz -C /tmp dpo

Settings, each its own process (peak memory is per process), on the same pairs in the same order:

    trl     TRL 1.16 DPOTrainer: its DataCollatorForPreference pads the 2B chosen + rejected sequences of a
            micro-batch to the longest (padding_free is disabled in TRL 1.16), its fused LM head
    packed  PackingDPOTrainer(...): the same per_device_train_batch_size pairs per micro-batch (the same steps and
            pairs as trl), flattened into one row [P1 C1 | P1 R1 | P2 C2 | ...], its packed attention
    shared  PackingDPOTrainer(..., share_prompt=True): each prompt laid out once ([P1 C1 R1 | ...]); where this
            version has no share_prompt, the run fails and its JSON records the error (the driver goes on)

Model: the 1B Llama shape (hidden 2048, 16 layers, 32 query / 8 kv heads of 64, MLP 8192, vocabulary --vocab
32000), seeded random init in float32 then bf16 (_vs_trl_settings.build_model), ``bf16=True``,
``attn_implementation="flash_attention_4"`` (``--attn``) on every side (PackingDPOTrainer picks packing_fa4, the
same kernel), the reference a deep copy of the model passed as ``ref_model`` to both trainers (TRL would load it
from the hub name otherwise). DPOConfig: AdamW fused (``--optim``), lr 1e-6 constant (TRL's default rate),
beta 0.1 and loss sigmoid (TRL's defaults), disable_dropout (default), max_length 2048, logging_steps 1,
``--warmup`` + ``--steps`` optimizer steps of one micro-batch each (default 3 + 12). Gradient checkpointing
``--grad-checkpointing on`` by default (DPOConfig's default; use_reentrant False): without it TRL's padded short_prompt
micro-batch (18 pairs: about 54k padded positions on average, up to 74k, at about 1.5 MB of activations a position
without checkpointing on this shape; 34 GiB at 16k in vs_trl_h100) would not fit an 80 GB card; ``off`` is there for
the long_prompt mix (about 19k padded positions). FA4 runs through ulysses_vs_deepspeed.py's int-lengths wrapper
(``fa4_int_lengths``, counted in the JSON). With lr 1e-6 on bf16 weights most updates fall below bf16's resolution:
the loss stays near ln 2 and the margins near 0; the forward's agreement shows in logps/chosen and logps/rejected.

Data (_dpo_data.py): text pairs over a word-level tokenizer of --vocab ids made in place (<pad>, <eos>, w0 ..;
one word one token; each completion ends with <eos>, counted), drawn from one generator seeded by (seed, mix):

    short_prompt  prompt ~ lognormal(4.7, 0.8) clipped [8, 1024] (mean 150); chosen, rejected each ~ sft (lognormal
                  (5.3, 0.9) clipped [8, 2048]), capped at 2048 - prompt (mean 294): |P C| + |P R| mean 889
                  -> 18 pairs per micro-batch (about 16k real tokens)
    long_prompt   prompt ~ lognormal(ln 1500 - 0.15^2/2, 0.15) clipped [1000, 1800] (mean 1,487); chosen,
                  rejected each uniform over the integers [100, 200]: |P C| + |P R| mean 3,273 -> 5 pairs (16.4k)

Pairs per micro-batch = round(--tokens-per-batch 16384 / the mix's mean |P C| + |P R|) (``--pairs-per-batch``
overrides); the dataset holds exactly the pairs of the run's steps (one epoch, the Trainer's seeded shuffle).

Measured in every setting the same way (_dpo_measure.py: vs_trl's StepRecorder, counting pairs): each optimizer
step timed between synchronizations; its real tokens = sum over its pairs of |P C| + |P R| (what TRL's padded batch
holds unpadded, read from the pairs, so the shared setting gets credit for the same pairs and its tokens/s shows
the saved prompt work), the tokens the model ran (TRL: padded rows; shared: the shorter row), pairs, a checksum of
the pairs' token ids, the loss and everything the trainer logged (TRL's rewards/*, logps/*, ...). Reported: the
median step's real tokens/s after --warmup steps, the steady rate, stalls (steps over 2x the median: FA4 compiles at
new shapes; only PackingDPOTrainer warms FA4 up before its first step) listed apart, the whole run's rate, peak
allocated memory over the run, first losses, versions, GPU, the command. ``--compare`` (_dpo_report.py) writes
results.json, a row per (mix, packed | shared): ``packed_vs_trl`` (the row's median tokens/s / trl's, for shared
too), ``shared_vs_packed`` (shared / packed), both peaks and their ratios, and the agreement with trl per step
(the same pairs; the max relative difference of the loss, rewards/margins, rewards/chosen, logps/*).

``--all`` runs trl and packed of each mix, then shared (long_prompt first, where sharing matters), each its own
process bounded by --timeout and by what is left of --deadline (a run that fails or is cut gets an error JSON; the
driver goes on), logs in DIR/logs/, then the comparison. Estimated on one H100 at the defaults (arithmetic from
vs_trl_h100's 1B rates and setup times, not yet measured; each about 15 s of imports and CUDA start, 5-10 s of
model, data and trainer, then its steps): short_prompt trl 60-90 s (about 1.2-1.6 s a step: 3.4x padded positions
in its linear layers; 2-4 FA4 compile stalls of 3-10 s), packed 45-60 s (0.4-0.5 s a step; the probe and FA4
warm-up 10-20 s before it), shared 40-55 s; long_prompt trl 45-65 s (0.5-0.6 s a step, 1.15x padded), packed
40-55 s, shared 35-50 s: 4.5-6.5 minutes in all, under the default --deadline of 480 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent)]  # _dpo_*, _vs_trl_*, vs_trl; benchmarks/: _shared, _lengths
sys.path.append(str(ROOT))  # packing_collators from this checkout where it is not installed
from _dpo_report import compare  # noqa: E402  (no torch: --compare runs anywhere)

SETTINGS = ("trl", "packed", "shared")
MIXES = ("short_prompt", "long_prompt")
DEFAULTS = {  # option: (GPU default, --smoke default)
    "vocab": (32000, 512),
    "steps": (12, 4),
    "warmup": (3, 2),
    "tokens_per_batch": (16384, 1024),
    "optim": ("adamw_torch_fused", "adamw_torch"),
    "attn": ("flash_attention_4", "sdpa"),
    "lr": (1e-6, 1e-3),  # smoke: large enough that the tiny float32 model's losses move from step to step
}
FORWARDED = (*DEFAULTS, "pairs_per_batch", "grad_checkpointing", "seed", "out")  # what --all passes on


def _arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--out", required=True, help="folder of <mix>_<setting>_gc_<on|off>.json, results.json and README.md")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--setting", choices=SETTINGS, help="run this one setting of one --mix in this process")
    what.add_argument("--all", action="store_true", help="run --settings x --mix one after the other, a process each")
    what.add_argument("--compare", action="store_true", help="write results.json and README.md from --out's files")
    add("--mix", default=",".join(MIXES), help=f"a comma list of {', '.join(MIXES)} (--setting: one)")
    add("--settings", default=",".join(SETTINGS), help="--all: a comma list (default: trl,packed,shared)")
    add("--timeout", type=float, default=150, help="--all: seconds per run before it is stopped (150)")
    add("--deadline", type=float, default=480, help="--all: no run starts or goes on past this many seconds (480)")
    add("--smoke", action="store_true", help="tiny shapes on the CPU: hidden 64, 2 layers, vocab 512, float32, sdpa,\n"
        "lengths / 8 (max_length 256), 1024 tokens per micro-batch, 2 + 4 steps, lr 1e-3;\n"
        "--all: OMP_NUM_THREADS=1 unless set")  # fmt: skip
    add("--vocab", type=int, help="vocabulary = the tokenizer's ids (32000)")
    add("--steps", type=int, help="timed optimizer steps after the warm-up (12)")
    add("--warmup", type=int, help="first steps left out of the median and steady rates (3)")
    add("--tokens-per-batch", type=int, help="real tokens a micro-batch holds on average: sets its pairs (16384)")
    add("--pairs-per-batch", type=int, help="pairs per micro-batch, overriding --tokens-per-batch")
    add("--grad-checkpointing", choices=("on", "off"), default="on", help="(on: DPOConfig's default; see above)")
    add("--optim", help="the same optimizer everywhere (adamw_torch_fused; smoke: adamw_torch)")
    add("--attn", help="attn_implementation of the model (flash_attention_4; smoke: sdpa)")
    add("--lr", type=float, help="learning rate, constant (1e-6; smoke: 1e-3)")
    add("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, (gpu, smoke) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else gpu)
    args.gc = args.grad_checkpointing == "on"
    args.mixes = args.mix.split(",")
    unknown = sorted(set(args.mixes) - set(MIXES))
    if unknown:
        parser.error(f"unknown mix {unknown}; choose from {', '.join(MIXES)}")
    if args.setting and len(args.mixes) != 1:
        parser.error("--setting runs one --mix")
    return args


def run_name(mix: str, setting: str, gc: bool) -> str:
    return f"{mix}_{setting}_gc_{'on' if gc else 'off'}"


def pairs_per_batch(args, mix: str) -> int:
    from _dpo_data import pairs_per_batch as from_mix

    return args.pairs_per_batch or from_mix(mix, args.tokens_per_batch, args.seed, args.smoke)


# ----------------------------------------------------------------------------- one setting, in this process
def dpo_config(args, cuda: bool, pairs: int):
    """The DPOConfig both libraries train with (TRL's defaults for beta, loss type, dropout)."""
    import tempfile

    from _dpo_data import max_length
    from trl import DPOConfig

    return DPOConfig(
        output_dir=tempfile.mkdtemp(prefix="dpo_throughput_"),
        max_steps=args.warmup + args.steps,
        per_device_train_batch_size=pairs,
        max_length=max_length(args.smoke),
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        optim=args.optim,
        bf16=cuda,
        gradient_checkpointing=args.gc,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        use_cpu=not cuda,
        disable_tqdm=True,
        dataloader_pin_memory=cuda,
    )


def build_trainer(args, model, reference, dataset, pairs: int):
    """``args.setting``'s trainer as a user builds it: the same config, pairs, tokenizer and reference."""
    from _dpo_data import word_tokenizer

    config = dpo_config(args, next(model.parameters()).device.type == "cuda", pairs)
    common = dict(model=model, ref_model=reference, args=config, train_dataset=dataset,
                  processing_class=word_tokenizer(args.vocab))  # fmt: skip
    if args.setting == "trl":
        from trl import DPOTrainer

        return DPOTrainer(**common)
    from packing_collators import PackingDPOTrainer

    return PackingDPOTrainer(**common, **({"share_prompt": True} if args.setting == "shared" else {}))


def _attention(trainer, model) -> str | None:
    if model is None:
        return None
    inner = trainer.accelerator.unwrap_model(model)
    return getattr(inner.config, "_attn_implementation", None)


def _train(args, context: dict) -> dict:
    """Build, train and measure ``args.setting`` on ``args.mix``: the JSON's figures (``context``: what exists so far)."""
    import copy

    import _vs_trl_settings as settings
    import datasets
    from _dpo_data import MIXES as DRAWS
    from _dpo_data import max_length, mean_pair_tokens, pair_lengths, text_pairs
    from _dpo_measure import PairStepRecorder, logged_metrics
    from _vs_trl_measure import device_name, fa4_int_lengths, step_statistics, versions
    from vs_trl import _device

    context["versions"] = {**versions(), "commit": _commit()}
    device = _device(smoke=args.smoke)  # vs_trl.py's selection, --smoke or not; this harness has no --memory-cap-gib
    context["device"] = device_name(device)
    fa4 = fa4_int_lengths() if device.type == "cuda" else {"installed": False}  # before the model
    began = time.perf_counter()
    context["phase"] = "model and data"
    model = settings.build_model(args, device)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    pairs = pairs_per_batch(args, args.mix)
    lengths = pair_lengths(args.mix, (args.warmup + args.steps) * pairs, args.seed, args.smoke)
    dataset = datasets.Dataset.from_list(text_pairs(lengths, args.vocab, args.seed))
    recorder = context["recorder"] = PairStepRecorder(device)
    recorder.watch_memory()  # from here on: the trainers' construction, their checks, the steps
    context["phase"] = "trainer"
    trainer = build_trainer(args, model, reference, dataset, pairs)
    built = time.perf_counter()
    recorder.attach(trainer, max_length(args.smoke))
    context["phase"] = "training"
    trainer.train()
    trained = time.perf_counter()
    steps, logged = recorder.steps(), logged_metrics(trainer)
    for step in steps:
        step["logged"] = logged.get(step["step"], {})
    timed = steps[args.warmup :] or steps
    return {
        "pairs_per_batch": pairs,
        "attention": _attention(trainer, trainer.model),
        "ref_attention": _attention(trainer, trainer.ref_model),
        "share_prompt": getattr(trainer, "share_prompt", None),
        "fa4_int_lengths": fa4,
        "statistics": step_statistics(steps, args.warmup, recorder.last_end - recorder.first_begin),
        "mean_model_tokens_per_step": sum(s["model_tokens"] for s in timed) / len(timed),
        "mean_prompt_tokens_per_step": sum(s["prompt_tokens"] for s in timed) / len(timed),
        **recorder.memory(),
        "first_losses": [s["loss"] for s in steps[:5]],
        "first_logged": [s["logged"] for s in steps[:3]],
        "model": {"dims": settings.DIMS["smoke" if args.smoke else "1b"], "parameters": model.num_parameters()},
        "data": {
            "mix": DRAWS[args.mix],
            "pairs": len(dataset),
            "max_length": max_length(args.smoke),
            "mean_pair_tokens": mean_pair_tokens(args.mix, args.seed, args.smoke),
            "mean_prompt_chosen_rejected": [float(x) for x in lengths.mean(axis=0)],
        },
        "options": {k: getattr(args, k) for k in (*DEFAULTS, "pairs_per_batch", "seed")},
        "steps_run": len(steps),
        "steps_planned": args.warmup + args.steps,
        "setup_seconds": built - began,
        "train_call_seconds": trained - built,
        "steps": steps,
    }


def run_setting(args) -> dict:
    """Run ``args.setting``; write ``<out>/<name>.json`` (its figures, or ``error`` if it failed) and return it."""
    args.mix = args.mixes[0]
    result = {
        "setting": args.setting,
        "mix": args.mix,
        "name": run_name(args.mix, args.setting, args.gc),
        "side": "trl" if args.setting == "trl" else "ours",
        "grad_checkpointing": args.gc,
        "smoke": args.smoke,
        "command": _command(),
        "error": None,
    }
    context = {"phase": "imports"}
    try:
        result.update(_train(args, context))
    except (Exception, SystemExit) as error:  # recorded, not raised: --all goes on and --compare shows it
        recorder = context.get("recorder")
        result.update(
            error={
                "type": type(error).__name__,
                "message": str(error),
                "phase": context["phase"],
                "traceback": traceback.format_exc()[-4000:],
            },
            **(recorder.memory() if recorder is not None else {}),
        )
    result.update(device=context.get("device"), versions=context.get("versions"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{result['name']}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("steps", "first_logged")}), flush=True)
    if result["error"]:
        print(result["error"]["traceback"], file=sys.stderr, flush=True)
        raise SystemExit(1)
    return result


def _command() -> str:
    """This process's command line, the script's path from the repository root (as vs_trl.py writes it)."""
    script = Path(sys.argv[0]).resolve()
    return shlex.join(
        ["python", str(script.relative_to(ROOT) if script.is_relative_to(ROOT) else script), *sys.argv[1:]]
    )


def _commit() -> str | None:
    from vs_trl import _commit as commit

    return commit()


# ----------------------------------------------------------------------------- --all: one process per run
def plan(mixes: list[str], settings: list[str]) -> list[tuple[str, str]]:
    """(mix, setting) in run order: trl and packed of each mix, then shared, long_prompt first (the deadline cuts
    the least telling run).

    >>> plan(["short_prompt", "long_prompt"], ["trl", "packed", "shared"])  # doctest: +NORMALIZE_WHITESPACE
    [('short_prompt', 'trl'), ('short_prompt', 'packed'), ('long_prompt', 'trl'), ('long_prompt', 'packed'),
     ('long_prompt', 'shared'), ('short_prompt', 'shared')]
    """
    runs = [(m, s) for m in mixes for s in settings]
    return sorted(runs, key=lambda run: (run[1] == "shared", run[1] == "shared" and run[0] != "long_prompt"))


def _child_command(args, mix: str, setting: str) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--setting", setting, "--mix", mix]
    for name in FORWARDED:
        value = getattr(args, name)
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    return command + (["--smoke"] if args.smoke else [])


def _tail(log: Path, lines: int = 12) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []


def _outcome(path: Path, log: Path) -> str:
    """One progress line: the run's figures, or why it failed (its error and the end of its log)."""
    run = json.loads(path.read_text())
    if not run.get("error"):
        s, peak = run["statistics"], run["peak_memory_gib"]
        return (
            f"ok: median {s['median_tokens_per_s']:,.0f} real tokens/s, whole run "
            f"{s['whole_run_tokens_per_s']:,.0f}; {len(s['stalls'])} stalls ({s['stall_seconds']:.1f} s); peak "
            f"{'-' if peak is None else f'{peak:.1f} GiB'}; {run['pairs_per_batch']} pairs a step; first loss "
            f"{run['first_losses'][0]:.4f}"
        )
    error = run["error"]
    return f"FAILED in {error['phase']} ({error['type']}: {error['message'][:300]}); the end of {log}:\n    " + (
        "\n    ".join(_tail(log))
    )


def _stub(args, path: Path, mix: str, setting: str, kind: str, message: str) -> None:
    """The error JSON of a run that wrote none (stopped by its timeout, the deadline, or a crash)."""
    path.write_text(json.dumps({
        "setting": setting, "mix": mix, "name": path.stem, "side": "trl" if setting == "trl" else "ours",
        "grad_checkpointing": args.gc, "smoke": args.smoke, "command": shlex.join(_child_command(args, mix, setting)),
        "error": {"type": kind, "message": message, "phase": "driver"},
    }, indent=1) + "\n")  # fmt: skip


def drive(args) -> None:
    """Every (mix, setting) of ``plan`` in its own process, one after the other, then the comparison."""
    settings = args.settings.split(",")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise SystemExit(f"unknown settings {unknown}; choose from {', '.join(SETTINGS)}")
    out = Path(args.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    if args.smoke:  # a tiny model gains nothing from threads; on a busy CPU, spinning threads cost seconds a step
        env.setdefault("OMP_NUM_THREADS", "1")
    runs = plan(args.mixes, settings)
    began = time.perf_counter()
    for i, (mix, setting) in enumerate(runs, 1):
        name = run_name(mix, setting, args.gc)
        path, log = out / f"{name}.json", logs / f"{name}.log"
        path.unlink(missing_ok=True)  # a JSON left by an earlier run is not this run's
        left = args.deadline - (time.perf_counter() - began)
        if left < 20:
            _stub(args, path, mix, setting, "deadline", f"not started: {left:.0f} s left of --deadline {args.deadline}")
            print(f"[{i}/{len(runs)}] {name}: skipped, the deadline is near", flush=True)
            continue
        limit = min(args.timeout, left)
        print(f"[{i}/{len(runs)}] {name}: started at {time.perf_counter() - began:.0f} s (limit {limit:.0f} s)",
              flush=True)  # fmt: skip
        started = time.perf_counter()
        with log.open("w") as sink:
            try:
                code = subprocess.run(_child_command(args, mix, setting), stdout=sink, stderr=subprocess.STDOUT,
                                      env=env, timeout=limit).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = "timeout"
        seconds = time.perf_counter() - started
        if not path.exists():  # stopped, or gone before writing its JSON (a crash, the kernel's OOM killer)
            kind = "timeout" if code == "timeout" else "crash"
            why = f"stopped after {seconds:.0f} s" if code == "timeout" else f"exit {code} without a JSON"
            _stub(args, path, mix, setting, kind, why + "; its log ends: " + " / ".join(_tail(log, 5)))
        print(f"[{i}/{len(runs)}] {name}: {seconds:.0f} s, {_outcome(path, log)}", flush=True)
    print(f"all runs: {time.perf_counter() - began:.0f} s", flush=True)
    print(compare(out), flush=True)


def main(argv=None) -> None:
    args = _arguments(argv)
    if args.compare:
        print(compare(Path(args.out)))
    elif args.all:
        drive(args)
    else:
        run_setting(args)


if __name__ == "__main__":
    main()
