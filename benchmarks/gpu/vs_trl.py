"""This library against TRL's SFTTrainer on one GPU (issue #42, item 5): tokens/s and peak memory, a process a setting.

    bash benchmarks/gpu/vs_trl_wheels.sh        # here, once: TRL's wheels into .trlwhl/ (its header: the device line)
    python benchmarks/gpu/vs_trl.py --all --vocab 151936 --grad-checkpointing on --out DIR     # every setting below
    python benchmarks/gpu/vs_trl.py --all --settings trl_bfd,ours_packing --vocab 32000 --out DIR
    python benchmarks/gpu/vs_trl.py --setting ours_packing --loss-implementation full --out DIR   # one process
    python benchmarks/gpu/vs_trl.py --compare --out DIR        # DIR/results.json and DIR/README.md
    python benchmarks/gpu/vs_trl.py --all --smoke --out /tmp/vs_trl    # the CPU check: tiny shapes, seconds each
    MODE=eager ROWS="152k:on" bash benchmarks/gpu/vs_trl_session.sh DIR  # issue #65's like-for-like pairs, a call

On the device (FA4 staged by ../shared/gpu/fa4-wheels.sh, call 1 as its header says), call 2 carries
[".fa4b", ".trlwhl"] and starts: ``source .fa4b/install.sh && python3 -m pip install -q --no-index --no-deps
--target /tmp/trl .trlwhl/*.whl && export PYTHONPATH=/tmp/trl:$PYTHONPATH``; write --out outside $OUT (at most 8
files come back) and tar it there.

Every setting trains a fresh Llama-style model of 1B (hidden 2048, 16 layers, 32 query / 8 kv heads of 64, MLP
8192, untied head of ``--vocab`` 32000 / 151936 / 248320), seeded random init in float32 then
``model.to(torch.bfloat16)``, ``bf16=True``, ``--optim`` AdamW (fused by default), lr 1e-5 constant, gradient
checkpointing ``--grad-checkpointing on|off`` (TRL's default is on), for ``--warmup`` + ``--steps`` optimizer steps
of one micro-batch each. Data: seeded examples whose lengths follow the ``sft`` distribution of
benchmarks/_lengths.py (lognormal(5.3, 0.9) clipped to [8, 2048], mean 296 tokens), token ids uniform over the
vocabulary, labels = input_ids (every token but each example's first is a target, on both sides).

    setting            who     what                                                                  pairs with
    trl_bfd            TRL     SFTTrainer, SFTConfig(packing=True, packing_strategy="bfd",            -
                               max_length=--budget 16384, per_device_train_batch_size=1): TRL packs
                               the tokenized dataset itself and turns padding_free on for bfd
    trl_padding_free   TRL     SFTConfig(padding_free=True, max_length=None,                          -
                               per_device_train_batch_size=--batch-size 42): no packing
    trl_auto_cap       TRL     bfd rows of the largest max_length that fits 90% of the card (below)   -
    ours_packing       ours    PackingTrainer(max_tokens_per_batch=--budget, per_device 1): its own  trl_bfd
                               choice of attention (packing_fa4 where FA4 is installed) and loss
                               (--loss-implementation, default auto: a chunk of tokens at a time)
    ours_flattening    ours    stock transformers.Trainer + FlatteningCollator(), batch 42, after     trl_padding_free
                               the one line packing_collators.enable_chunked_loss(model) (skipped
                               where this version lacks it: then the full logits). The SAME batches
                               as trl_padding_free (same dataset, order and seed): compare checks it
    ours_auto          ours    PackingTrainer(max_tokens_per_batch="auto"): the largest micro-batch   trl_auto_cap
                               it measures to fit 90% of the GPU, at most its ceiling (262,144)

``trl_auto_cap``, designed to be fair to TRL: TRL has no memory-measured budget, so a user who fills the card
raises ``max_length`` of its bfd rows until a step no longer fits. This setting finds that ``max_length``
without the trials, by the method ``ours_auto`` uses (``packing_collators.trainer.fit_token_budget``: peak memory
at two sizes, a line, the planned size measured again, within 90% of the card with AdamW's states counted), but
each measurement runs TRL's own step: its collator's batch, its ``compute_loss`` (a fused LM head that never forms
the full logits), backward, under the same gradient checkpointing. Then TRL's SFTTrainer trains bfd rows of that
``max_length`` (no ceiling: the largest that fits). The budget on each side is the JSON's ``max_tokens_per_batch`` / ``max_length``. Both auto settings
run on CUDA's expandable segments (``packing_collators.budget.avoid_fragmentation``: ours turns them on for its auto budget,
the harness does the same for TRL's). ``--memory-cap-gib 79`` runs any setting as on an 80 GB card on a larger one
(``torch.cuda.set_per_process_memory_fraction``; both auto budgets plan for the cap, allocations past it fail;
names end in ``_cap79``). The cap bounds PyTorch's caching allocator only: the CUDA context and library
workspaces lie outside it, so a capped card has up to ~1 GiB more room than a real one of that size.

``--torch-compile on`` (names hold ``_compiled_both``; pairs only with compiled runs): ``torch_compile=True`` in every
setting's arguments (Inductor; aot_eager under --smoke). TRL's Trainer then compiles the whole model (accelerate);
PackingTrainer compiles its decoder layers in place and keeps its chunked loss; ours_flattening leaves the flag off
and calls the documented ``compile_layers(model)`` after ``enable_chunked_loss(model)``, with FA4 as
``packing_fa4`` (the same kernel, one graph node) on a GPU.
``--torch-compile defaults`` (names hold ``_defaults``): each side as its user gets it, TRL eager (its default),
PackingTrainer with its default ``compile_layers="auto"`` (the layers compiled in place on a GPU), ours_flattening with
its documented lines (``enable_chunked_loss``, ``compile_layers``). ``off`` (names hold ``_eager_both``): every side
eager, PackingTrainer too (``compile_layers=False``).

Attention: FA4 on both sides (``--attn flash_attention_4``, transformers' own, for TRL's settings and
ours_flattening; PackingTrainer picks ``packing_fa4``, the same kernel). transformers 5.17 hands FA4 its max
lengths as 0-d tensors when it derives the examples from position_ids, which FA4 4.0.0b36 refuses: every CUDA
setting calls FA4 through ulysses_vs_deepspeed.py's int-lengths wrapper (imported from there), and its JSON counts
the calls that had tensor lengths (``fa4_int_lengths``). Only ours warms FA4 up before the first step; TRL's
first steps at new shapes compile kernels, so stalls are listed apart.

Measured in every setting the same way (_vs_trl_measure.py): a callback synchronizes at each optimizer step's
start and end; per step the real (non-padding) tokens, examples, a token-id checksum, the loss and seconds.
Reported: the median step's tokens/s (warm-up left out), the steady state (stalls, steps over 2x the median,
also left out; stalls anywhere listed), the whole run's tokens/s, ``torch.cuda.max_memory_allocated`` over the
whole run from the trainer's construction on (the budget dry runs included; their resets are folded in) and over
the training steps alone, the first losses, versions, GPU and command. ``--all`` runs the settings one after the
other, each its own process bounded by ``--timeout`` (a failed one is reported and skipped), logs in DIR/logs/,
then writes the comparison. Rough durations on one H100/H200 (arithmetic, not yet measured): 1-2 minutes for
each fixed-budget setting at 30 steps, 3-5 for each auto one (its steps hold hundreds of thousands of tokens).
Run with one GPU visible (``CUDA_VISIBLE_DEVICES=0``; ``--all`` sets it): several make the Trainer use
DataParallel.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent)]  # _vs_trl_*, ulysses_vs_deepspeed; benchmarks/: _shared, _lengths
sys.path.append(str(ROOT))  # packing_collators from this checkout where it is not installed
from _vs_trl_report import compare  # noqa: E402

SETTINGS = ("trl_padding_free", "ours_flattening", "trl_bfd", "ours_packing", "ours_auto", "trl_auto_cap")
DEFAULTS = {  # option: (GPU default, --smoke default)
    "vocab": (32000, 512),
    "steps": (30, 8),
    "warmup": (4, 2),
    "auto_steps": (8, 4),
    "budget": (16384, 512),
    "batch_size": (42, 8),
    "optim": ("adamw_torch_fused", "adamw_torch"),
    "attn": ("flash_attention_4", "sdpa"),
    "auto_tokens_guess": (524288, 2048),
}
FUSED = {  # ours' eager layers on fused kernels: option -> (packing_collators' function, what it found nothing of)
    "fused_norms": ("fuse_rms_norms", "no RMSNorm of this model computes rms_norm's numbers"),
    "fused_mlp": ("fuse_swiglu", "no MLP of this model computes down(silu(gate(x)) * up(x))"),
    "fused_rope": ("fuse_rope", "no layer of this model calls the standard apply_rotary_pos_emb"),
}
FORWARDED = (  # what --all passes on to each setting's process
    *DEFAULTS,
    "grad_checkpointing",
    "torch_compile",
    "distribution",
    "seed",
    "lr",
    "loss_implementation",
    *FUSED,
    "memory_fraction",
    "memory_cap_gib",
    "logging_steps",
    "examples",
    "out",
)


def _arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add = parser.add_argument
    add("--out", required=True, help="folder of <setting>_<vocab>_gc_<on|off>.json, results.json and README.md")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--setting", choices=SETTINGS, help="run this one setting in this process")
    what.add_argument("--all", action="store_true", help="run --settings one after the other, each its own process")
    what.add_argument("--compare", action="store_true", help="write results.json and README.md from --out's files")
    what.add_argument("--recount", action="store_true", help="recount the real tokens of --out's bucketed\n"
                      "PackingTrainer runs measured up to c2a4708 (_vs_trl_recount.py), then --compare")
    add("--settings", help=f"--all: a comma list (default: {','.join(SETTINGS)}; --smoke: the first four)")
    add("--timeout", type=float, default=480, help="--all: seconds per setting before it is stopped (480)")
    add("--smoke", action="store_true", help="tiny shapes on the CPU: hidden 64, 2 layers, vocab 512, float32, sdpa")
    add("--vocab", type=int, help="vocabulary: 32000 (default), 151936 (Qwen's) or 248320")
    add("--grad-checkpointing", choices=("on", "off"), default="on", help="(on: TRL's default)")
    add(
        "--torch-compile",
        choices=("on", "off", "defaults"),
        default="off",
        help="on: TrainingArguments(torch_compile=True) for TRL and PackingTrainer; ours_flattening\n"
        "compiles its layers with the documented line (compile_layers(model)) instead; defaults: each\n"
        "side as its user gets it (TRL eager, PackingTrainer's compile_layers='auto', ours_flattening's\n"
        "documented lines); off: every side eager (PackingTrainer(compile_layers=False))",
    )
    add("--steps", type=int, help="timed optimizer steps after the warm-up (30; auto settings: --auto-steps)")
    add("--warmup", type=int, help="first steps left out of the median and steady rates (4)")
    add("--auto-steps", type=int, help="timed steps of ours_auto and trl_auto_cap, whose steps are larger (8)")
    add("--budget", type=int, help="tokens per packed micro-batch: bfd's max_length, ours' budget (16384)")
    add("--batch-size", type=int, help="examples per step of trl_padding_free and ours_flattening (42)")
    add("--distribution", default="sft", help="the examples' standard length distribution (sft)")
    add("--examples", type=int, help="examples in the dataset (default: enough for the setting's steps)")
    add(
        "--auto-tokens-guess",
        type=int,
        help="auto settings: tokens per step the dataset is sized for (524288;\n"
        "a larger measured budget trains a second epoch of the same examples)",
    )
    add("--memory-fraction", type=float, default=0.9, help="trl_auto_cap: the share of the card its rows may fill")
    add("--memory-cap-gib", type=float, help="use at most this much of the GPU (torch.cuda.set_per_process_memory_\n"
        "fraction; both auto budgets plan for it): an 80 GB card's figures on a larger one")
    add("--attn", help="attention of TRL's settings and ours_flattening (flash_attention_4; smoke: sdpa)")
    add("--loss-implementation", choices=("auto", "chunked", "full"), default="auto", help="ours' loss (auto)")
    for option, (function, _) in FUSED.items():
        add(f"--{option.replace('_', '-')}", action="store_true", help=f"ours: {function}(model) first")
    add("--optim", help="the same optimizer everywhere (adamw_torch_fused; smoke: adamw_torch)")
    add("--lr", type=float, default=1e-5)
    add("--seed", type=int, default=0)
    add("--logging-steps", type=int, default=10)
    args = parser.parse_args(argv)
    for name, (gpu, smoke) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else gpu)
    args.gc = args.grad_checkpointing == "on"
    args.compiled = {"on": True, "off": False, "defaults": "defaults"}[args.torch_compile]  # the JSON's, pairs' key
    if args.memory_cap_gib is not None and args.memory_cap_gib <= 0:
        parser.error(f"--memory-cap-gib must be above 0 (GiB of the GPU this run may use), got {args.memory_cap_gib:g}")
    return args


def run_name(args, setting: str) -> str:
    """The JSON's stem: ``<setting>[_loss<impl>][_fusednorms][_fusedmlp][_fusedrope]_<eager_both|compiled_both|defaults>[_cap<GiB>]_<vocab>_gc_<on|off>``
    (ours' non-default loss and fused layers named; the like-for-like rows say so: both sides eager, or both compiled)."""
    named = setting.startswith("ours") and args.loss_implementation != "auto"
    loss = f"_loss{args.loss_implementation}" if named else ""
    if setting.startswith("ours"):
        loss += "".join(f"_{option.replace('_', '')}" for option in FUSED if getattr(args, option))
    compiled = {"on": "_compiled_both", "off": "_eager_both", "defaults": "_defaults"}[args.torch_compile]
    cap = f"_cap{args.memory_cap_gib:g}" if args.memory_cap_gib else ""
    return f"{setting}{loss}{compiled}{cap}_{args.vocab}_gc_{args.grad_checkpointing}"


# ----------------------------------------------------------------------------- one setting, in this process
def _device(*, smoke: bool, memory_cap_gib: float | None = None):
    """The one device a run trains on: the CPU under --smoke; else the one visible CUDA GPU, limited to
    ``memory_cap_gib`` GiB where given (--memory-cap-gib). Its options come by name, not as the caller's argparse
    namespace: dpo_throughput.py calls it too, with the options its own parser has, the same way with and without
    --smoke (its CPU test then reads them as the GPU run does)."""
    import torch

    if smoke:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: the 1B settings need one (--smoke runs tiny shapes on the CPU)")
    if torch.cuda.device_count() > 1:
        raise SystemExit("several GPUs are visible: set CUDA_VISIBLE_DEVICES=0 (the Trainer would use DataParallel)")
    device = torch.device("cuda", 0)
    if memory_cap_gib is not None:  # the card as one of that size: both auto budgets plan for it, allocations past it fail
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_cap_gib * 2**30 / total), device)
    return device


def _command() -> str:
    return shlex.join(["python", str(Path(sys.argv[0]).resolve().relative_to(ROOT)), *sys.argv[1:]])


def _commit() -> str | None:
    """The checkout's commit: $PACKING_COLLATORS_COMMIT where the tree was copied without its history (the device)."""
    if os.environ.get("PACKING_COLLATORS_COMMIT"):
        return os.environ["PACKING_COLLATORS_COMMIT"]
    try:
        found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return found.stdout.strip() or None


def run_setting(args) -> dict:
    """Build, train and measure ``args.setting``; write ``<out>/<name>.json`` and return it."""
    import _vs_trl_settings as settings
    from _vs_trl_measure import (
        StepRecorder,
        device_name,
        fa4_int_lengths,
        seconds_since_process_start,
        step_statistics,
        triton_variants,
        versions,
    )

    import packing_collators

    device = _device(smoke=args.smoke, memory_cap_gib=args.memory_cap_gib)
    fa4 = fa4_int_lengths() if device.type == "cuda" else {"installed": False}  # before the model: see its docstring
    began, imported_s = time.perf_counter(), seconds_since_process_start()
    model = settings.build_model(args, device)
    dataset = settings.make_dataset(args, settings.examples_needed(args, args.setting))
    recorder = StepRecorder(device)
    recorder.watch_memory()  # from here on: the trainer's construction, its dry runs, the steps
    for option, (function, none) in FUSED.items():  # each one documented line before the trainer
        fuse = getattr(packing_collators, function)
        if args.setting.startswith("ours") and getattr(args, option) and not fuse(model):
            raise SystemExit(f"--{option.replace('_', '-')}: {none}")
    trainer, about = settings.BUILDERS[args.setting](args, model, dataset)
    built = time.perf_counter()
    recorder.attach(trainer)
    trainer.train()
    trained = time.perf_counter()
    steps = recorder.steps()
    timed_steps = args.auto_steps if settings.FAMILY[args.setting] == "auto" else args.steps
    mean = settings.mean_length(args)
    result = {
        "setting": args.setting,
        "name": run_name(args, args.setting),
        "side": "ours" if args.setting.startswith("ours") else "trl",
        "vocab": args.vocab,
        "grad_checkpointing": args.gc,
        "compiled": args.compiled,
        "smoke": args.smoke,
        "device": device_name(device),
        **settings.described(trainer, args.setting, about),
        "fa4_int_lengths": fa4,
        "statistics": step_statistics(steps, args.warmup, recorder.last_end - recorder.first_begin),
        **recorder.memory(),
        "first_losses": [s["loss"] for s in steps[:5]],
        "model": {"dims": settings.DIMS["smoke" if args.smoke else "1b"], "parameters": model.num_parameters()},
        "data": {"distribution": args.distribution, "examples": len(dataset), "mean_length": mean},
        "options": {k: getattr(args, k) for k in (*DEFAULTS, "lr", "seed", "loss_implementation", *FUSED, "memory_fraction",
                                                   "memory_cap_gib")},
        "steps_run": len(steps),
        "steps_planned": args.warmup + timed_steps,
        "setup_seconds": built - began,
        "train_call_seconds": trained - built,
        "first_step_s": recorder.first_step_s,
        "first_step_phases_s": {  # where first_step_s went (the warm-up: PackingTrainer's FA4 warm-up alone)
            "imports": imported_s,
            "setup": built - began,
            "train_call_to_step_1": recorder.first_begin - built if recorder.first_begin else None,
            "step_1": steps[0]["seconds"] if steps else None,
            "fa4_warm_up": getattr(getattr(trainer, "_warm_up", None), "seconds", None),
        },
        "startup_parts_s": getattr(trainer, "startup_seconds", None),  # PackingTrainer's parts before step 1
        "triton_variants": triton_variants(),
        "versions": {**versions(), "commit": _commit()},
        "command": _command(),
        "steps": steps,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{result['name']}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}), flush=True)
    return result


# ----------------------------------------------------------------------------- --all: one process per setting
def _child_command(args, setting: str) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--setting", setting]
    for name in FORWARDED:
        value = getattr(args, name)
        if isinstance(value, bool):  # a switch: its flag where on
            command += [f"--{name.replace('_', '-')}"] if value else []
        elif value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    return command + (["--smoke"] if args.smoke else [])


def _outcome(args, setting: str, code: int, log: Path) -> str:
    """One progress line: the row's figures, or why it failed and the end of its log."""
    path = Path(args.out) / f"{run_name(args, setting)}.json"
    if code == 0 and path.exists():
        run = json.loads(path.read_text())
        s, peak = run["statistics"], run["peak_memory_gib"]
        return (
            f"ok: median {s['median_tokens_per_s']:,.0f} tokens/s, steady {s['steady_tokens_per_s']:,.0f}, whole run "
            f"{s['whole_run_tokens_per_s']:,.0f}; {len(s['stalls'])} stalls ({s['stall_seconds']:.1f} s); peak "
            f"{'-' if peak is None else f'{peak:.1f} GiB'}; first loss {run['first_losses'][0]:.4f}"
        )
    tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    return f"FAILED (exit {code}); the end of {log}:\n    " + "\n    ".join(tail)


def drive(args) -> None:
    """Every setting of ``--settings`` in its own process, one after the other, then the comparison."""
    names = args.settings.split(",") if args.settings else list(SETTINGS[:4] if args.smoke else SETTINGS)
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        raise SystemExit(f"unknown settings {unknown}; choose from {', '.join(SETTINGS)}")
    logs = Path(args.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    began = time.perf_counter()
    for i, setting in enumerate(names, 1):
        log = logs / f"{run_name(args, setting)}.log"
        print(f"[{i}/{len(names)}] {setting}: started at {time.perf_counter() - began:.0f} s", flush=True)
        started = time.perf_counter()
        with log.open("w") as sink:
            try:
                code = subprocess.run(_child_command(args, setting), stdout=sink, stderr=subprocess.STDOUT, env=env,
                                      timeout=args.timeout).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = "timeout"
        seconds = time.perf_counter() - started
        print(f"[{i}/{len(names)}] {setting}: {seconds:.0f} s, {_outcome(args, setting, code, log)}", flush=True)
    if any(Path(args.out).glob("*_gc_*.json")):
        print(compare(Path(args.out)), flush=True)


def main(argv=None) -> None:
    args = _arguments(argv)
    if args.recount:
        from _vs_trl_recount import recount

        print("recounted:", ", ".join(recount(Path(args.out), _arguments)) or "none")
        print(compare(Path(args.out)))
    elif args.compare:
        print(compare(Path(args.out)))
    elif args.all:
        drive(args)
    else:
        run_setting(args)


if __name__ == "__main__":
    main()
