"""scale_8b.py's results: results.json's rows, scaling and loss checks from the runs' records, and report.md.

Rows (issue #46, item 5): per GPU count, local batch and setting, ours and torchtitan's tokens/s per GPU on the
same GPUs, MFU (``_scale_8b_metrics.py``), peak memory; the scaling 1 -> 2 -> 4 per GPU at each local batch; ours
against its replays (the 2- and 1-GPU runs train the 4-GPU run's steps: equal losses within bf16 noise,
``TOLERANCE`` relative per step). torchtitan's tokens/s is that of its timed steps as one window (the harmonic mean
of its per-step ``tps``, steps after the first ``TITAN_SKIP``), as ours is its timed steps' tokens over their seconds.
Local batch 2 (the ``_lb2`` runs): torchtitan's published setting, two 8,192-token rows per GPU a step; ours packs
them as one 16,384-token row (documents of at most 8,192 tokens, attention per document either way).
"""

from __future__ import annotations

from _scale_8b_metrics import (
    H100_BF16_PEAK,
    LLAMA_3_1_8B,
    causal_document_flops_per_token,
    flops_per_token,
    mfu,
    steady,
)

TITAN_SKIP = 3  # torchtitan: first steps left out (compiles, first all-gathers)
TOLERANCE = 0.02  # max relative loss difference per step against the replay counted as bf16 noise
SEQ = 8192
LOCAL_BATCHES = {"": 1, "_lb2": 2, "_lb4": 4}  # run-name suffix: rows of SEQ tokens per GPU a step
KEYS = {"": "scaling", "_lb2": "scaling_local_batch_2", "_compile_lb2": "scaling_local_batch_2_compiled",
        "_lb4": "scaling_local_batch_4"}  # results.json's scaling entries, by run-name suffix
TRAINER_4 = ("", "_keep_compile")  # ours_trainer_4<lb><this>: as it ships; keeping the gathered parameters, compiled


def machines_of(runs: dict) -> list[str]:
    """The machines the runs came from, as run-name suffixes: "" for the first folder's (or a single call's), then
    ``@<folder>`` for each later folder's (``merge_folders``): 4-GPU rows and scaling compare within a machine.

    >>> machines_of({"ours_4_lb2": {}, "ours_1_lb2@b": {}, "titan_varlen_4_lb2@c": {}, "commit@b": {}})
    ['', '@b', '@c']
    """
    return [""] + sorted({"@" + name.partition("@")[2] for name in runs if "@" in name})


def titan_summary(run: dict) -> dict | None:
    """torchtitan's timed steps: tokens/s per GPU (one window), MFU both ways, its own MFU, memory, losses."""
    tps = [s["tps"] for s in run.get("steps", [])]
    timed = tps[TITAN_SKIP:]
    if not timed:
        return None
    rate = len(timed) / sum(1 / t for t in timed)  # the window's tokens / its seconds: every step has SEQ tokens
    data = run.get("data") or {}
    if run.get("flavor") == "8B":  # sdpa: one causal sequence over each whole row
        documents = [SEQ] * max(1, data.get("rows", 1))
    else:  # varlen: each document causally, cut where torchtitan cuts them
        documents = data.get("documents") or [SEQ]
    flops = flops_per_token(LLAMA_3_1_8B, SEQ)
    return {
        "tokens_per_s_per_gpu": rate,
        "median_step_tps": steady(tps, TITAN_SKIP),
        "mfu": mfu(flops, rate),
        "mfu_causal_documents": mfu(causal_document_flops_per_token(LLAMA_3_1_8B, documents), rate),
        "mfu_logged": steady([s["mfu_pct"] / 100 for s in run["steps"]], TITAN_SKIP),
        "peak_flops_logged": run.get("peak_flops"),
        "memory_reserved_gib": max(s["memory_gib"] for s in run["steps"]),
        "loss": [s["loss"] for s in run["steps"]],
        "steps_timed": len(timed),
    }


def loss_check(reference: dict | None, replay: dict | None) -> dict | None:
    """Per-step loss differences of a replay against the reference run, over the steps both ran."""
    if not reference or not replay or "loss" not in reference or "loss" not in replay:
        return None
    pairs = list(zip(reference["loss"], replay["loss"]))
    relative = max(abs(a - b) / max(abs(a), 1e-9) for a, b in pairs)
    return {
        "steps_compared": len(pairs),
        "max_abs": max(abs(a - b) for a, b in pairs),
        "max_relative": relative,
        "within_bf16_noise": relative <= TOLERANCE,
        "tolerance": TOLERANCE,
    }


def build(runs: dict) -> dict:
    """results.json: the rows, the scaling and the loss checks at each local batch, every run."""
    ok = {name: run for name, run in runs.items() if run.get("status") == "ok"}
    titans = {name: titan_summary(run) for name, run in ok.items() if name.startswith("titan_") and run.get("steps")}
    ours = {name: run for name, run in ok.items() if "tokens_per_s_per_gpu" in run}
    rows = []

    def row(name: str, setting: str, titan_name: str | None, comparison: str, local_batch: int, mine: bool = False) -> None:
        run = ours.get(name)  # mine: a row of ours beside a torchtitan run another row shows, so only where ours ran
        theirs = titans.get(titan_name) if titan_name else None
        if (run is None and theirs is None) or (mine and run is None):
            return
        ours_rate = run["tokens_per_s_per_gpu"] if run else None
        their_rate = theirs["tokens_per_s_per_gpu"] if theirs else None
        rows.append({
            "setting": setting, "gpus": run["gpus"] if run else 4, "local_batch": local_batch,
            "ours": name if run else None, "torchtitan": titan_name if theirs else None, "comparison": comparison,
            "tokens_per_s_per_gpu": ours_rate, "torchtitan_tokens_per_s_per_gpu": their_rate,
            "ours_vs_torchtitan": ours_rate / their_rate if ours_rate and their_rate else None,
            "mfu": run["mfu"] if run else None, "mfu_causal_documents": run.get("mfu_causal_documents") if run else None,
            "torchtitan_mfu": theirs["mfu"] if theirs else None,
            "torchtitan_mfu_causal_documents": theirs["mfu_causal_documents"] if theirs else None,
            "torchtitan_mfu_logged": theirs["mfu_logged"] if theirs else None,
            "peak_allocated_gib_per_gpu": max(run["peak_allocated_gib_per_gpu"]) if run else None,
            "peak_reserved_gib_per_gpu": max(run.get("peak_reserved_gib_per_gpu") or [None]) if run else None,
            "torchtitan_peak_reserved_gib": theirs["memory_reserved_gib"] if theirs else None,
            "compile": bool(run["compile"]) if run else bool(runs.get(titan_name, {}).get("compile")),
            "machine": (name if run else titan_name or "").partition("@")[2] or None,
        })  # fmt: skip

    same = "ours: packed documents (FA4 varlen); torchtitan: its varlen attention over the same documents"
    unpacked = ("ours: packed documents; torchtitan: the same tokens as unpacked 8,192-token rows, one causal "
                "sequence each (its published setting; the user's comparison)")  # fmt: skip
    out = {"scaling": {}, "losses": {}, "machines": {}}
    for m, s in ((m, s) for m in machines_of(runs) for s in LOCAL_BATCHES):  # m: "" (first folder) or "@<folder>"
        lb = LOCAL_BATCHES[s]
        tokens = "1 x 8,192 tokens" if lb == 1 else f"{lb} x 8,192 tokens (ours: {'one' if lb == 2 else 'two'} 16,384-token row{'s' * (lb > 2)})"
        row(f"ours_4{s}{m}", f"4 GPUs, FSDP2, full AC, bf16, {tokens}, eager", f"titan_varlen_4{s}{m}", same, lb)
        if f"titan_causal_4{s}{m}" in titans:  # torchtitan's published setting: a row only where it ran
            row(f"ours_4{s}{m}", f"4 GPUs, FSDP2, full AC, bf16, {tokens}, eager", f"titan_causal_4{s}{m}", unpacked, lb)
        row(f"ours_4_compile{s}{m}", f"4 GPUs, {tokens}, torch.compile per layer", f"titan_varlen_4_compile{s}{m}",
            same, lb)  # fmt: skip
        row(f"ours_4_keep{s}{m}", f"4 GPUs, {tokens}, eager, gathered parameters kept from forward to backward "
            "(reshard_after_forward never, both sides)", f"titan_varlen_4_keep{s}{m}", same, lb)  # fmt: skip
        row(f"ours_4_keep_bf16_reduce{s}{m}", f"4 GPUs, {tokens}, eager, gathered parameters kept, gradients reduced "
            "in bf16 (torchtitan's: float32, its only choice)", f"titan_varlen_4_keep{s}{m}", same, lb, mine=True)  # fmt: skip
        row(f"ours_4_keep_compile{s}{m}", f"4 GPUs, {tokens}, torch.compile per layer, gathered parameters kept "
            "(both sides)", f"titan_varlen_4_keep_compile{s}{m}", same, lb)  # fmt: skip
        row(f"ours_4_keep_bf16_reduce_compile{s}{m}", f"4 GPUs, {tokens}, torch.compile per layer, gathered "
            "parameters kept, gradients reduced in bf16 (torchtitan's: float32)", f"titan_varlen_4_keep_compile{s}{m}",
            same, lb, mine=True)  # fmt: skip
        row(f"ours_4_torch_norm{s}{m}", f"4 GPUs, {tokens}, eager, RMSNorm as torch's fused kernel (torchtitan's "
            "nn.RMSNorm; ours: transformers' op by op otherwise)", f"titan_varlen_4{s}{m}", same, lb, mine=True)  # fmt: skip
        for keep in TRAINER_4:
            trainer = ours.get(f"ours_trainer_4{s}{keep}{m}", {})
            loop = f"ours_4{'_keep_bf16_reduce' * bool(keep)}{'_compile' * bool(trainer.get('compile'))}{s}{m}"
            row(f"ours_trainer_4{s}{keep}{m}", f"4 GPUs, {tokens}, PackingTrainer (accelerate FSDP2: gradients reduced "
                f"in bf16{', gathered parameters kept' * bool(keep)}), "
                f"{'layers compiled' if trainer.get('compile') else 'eager'}", None,
                f"ours through the Trainer (our loop on the same GPUs: {_ratio_to(ours, trainer, loop)})", lb)  # fmt: skip
        row(f"ours_2{s}{m}", f"2 GPUs, {tokens} ({_ranks(ours, f'ours_2{s}{m}')})", None,
            f"scaling; replay of ours_4{s}", lb)  # fmt: skip
        row(f"ours_2_keep{s}{m}", f"2 GPUs, {tokens}, as above, reshard_after_forward never", None,
            f"scaling; replay of ours_4{s}", lb)  # fmt: skip
        row(f"ours_1{s}{m}", f"1 GPU, {tokens} ({_ranks(ours, f'ours_1{s}{m}')}), no FSDP", None,
            f"scaling; replay of ours_4{s}", lb)  # fmt: skip
        row(f"ours_1_compile{s}{m}", f"1 GPU, {tokens}, torch.compile per layer, no FSDP", None,
            f"scaling; replay of ours_4_compile{s}", lb)  # fmt: skip
        scaling = {s: _scaling(ours, runs, s, machine=m), f"_compile{s}": _scaling(ours, runs, s, "_compile", m)}
        (out["machines"].setdefault(m[1:], {}) if m else out["scaling"]).update(scaling)
        out["losses"].update(_losses(ours, s, m))
    for name, loop in _trainer_loops(ours).items():
        gpus = ours[name]["gpus"]
        row(name, f"{gpus} GPU{'s' * (gpus > 1)}, 2 x 8,192 tokens (one 16,384-token row), "
            f"PackingTrainer ({'accelerate FSDP2' if gpus > 1 else 'no FSDP'}; "
            f"{'layers compiled' if ours[name].get('compile') else 'eager'})", None,
            f"ours through the Trainer (our loop on the same GPUs: {loop if loop in ours else 'not run'})", 2)  # fmt: skip
    card = next((r.get("card") for r in ours.values()), None)
    return {
        "issue": 46,
        "card": card,
        "peak_flops": H100_BF16_PEAK,
        "flops_per_token": flops_per_token(LLAMA_3_1_8B, SEQ),
        "flops_counting": "torchtitan's: 6 x non-embedding parameters + 12 x layers x heads x head_dim x 8,192 per "
        "token (attention charged the whole row); mfu_causal_documents charges each query its own document's "
        "earlier keys only; recompute counted in neither; peak H100 SXM bf16 dense 989 TFLOP/s",
        "rows": rows,
        **{key: out["scaling"][k] for k, key in KEYS.items()},
        "loss_vs_replay": out["losses"],
        "machines": {machine: {KEYS[k]: v for k, v in scaling.items() if k in KEYS}
                     for machine, scaling in out["machines"].items()},  # later folders' scaling, as above
        "two_gpus_local_batch_2": two_gpus(ours),
        "eight_gpus": "not lent: run scale_8b.py on nvidia-h100-x8 with --replicas 8 when status lists it",
        "runs": runs,
    }


def _ratio_to(ours: dict, run: dict, loop: str) -> str:
    """``loop`` and ``run``'s tokens/s against it, or "not run".

    >>> _ratio_to({"a": {"tokens_per_s_per_gpu": 100.0}}, {"tokens_per_s_per_gpu": 99.0}, "a")
    'a, 0.990x'
    """
    if loop not in ours or "tokens_per_s_per_gpu" not in run:
        return "not run"
    return f"{loop}, {run['tokens_per_s_per_gpu'] / ours[loop]['tokens_per_s_per_gpu']:.3f}x"


def _ranks(ours: dict, name: str) -> str:
    """How a replay trains the 4-GPU run's steps: its sampler ranks and micro-batches per step."""
    run = ours.get(name, {})
    ranks, each = run.get("replicas", 4), run.get("micro_batches_per_step_per_gpu", 4 // max(1, run.get("gpus", 1)))
    return f"{ranks} sampler ranks: {each} micro-batches per step"


def _scaling(ours: dict, runs: dict, suffix: str, compiled: str = "", machine: str = "") -> dict:
    """Tokens/s per GPU at 1, 2 and 4 GPUs (one local batch), and each against the fewest GPUs that ran: over each
    run's own timed steps (``per_gpu_efficiency``), and over the same steps (``same_steps_efficiency``, the fair one:
    a replay trains the same micro-batches at step k, whose attention costs differ from step to step).
    ``compiled="_compile"``: the compiled runs against the compiled replay (the Trainer compiles by default).
    ``machine``: the runs of that machine only (``machines_of``).

    >>> run = lambda gpus, rate: {"gpus": gpus, "tokens_per_s_per_gpu": rate}
    >>> out = _scaling({"ours_1_compile_lb2": run(1, 100.0), "ours_4_compile_lb2": run(4, 95.0),
    ...                 "ours_4_lb2": run(4, 80.0)}, {}, "_lb2", "_compile")
    >>> out["base"], out["per_gpu_efficiency"]
    ('ours_1_compile_lb2', {'ours_1_compile_lb2': 1.0, 'ours_4_compile_lb2': 0.95})
    """
    names = [f"{n}{compiled}{suffix}{machine}" for n in ("ours_1", "ours_2", "ours_2_keep", "ours_4", "ours_4_keep",
                                                          "ours_4_keep_bf16_reduce")]  # fmt: skip
    for trainer in (f"ours_trainer_4{suffix}{keep}{machine}" for keep in TRAINER_4):
        if bool(ours.get(trainer, {}).get("compile")) == bool(compiled):  # beside the replay compiled as it was
            names.append(trainer)
    per_gpu = {n: {"gpus": ours[n]["gpus"], "tokens_per_s_per_gpu": ours[n]["tokens_per_s_per_gpu"],
                   "step_token_imbalance": ours[n].get("step_token_imbalance")}
               for n in names if n in ours}  # fmt: skip
    base_name = next(iter(per_gpu), None)  # the fewest GPUs that ran: 1, else 2
    base = per_gpu.get(base_name)
    return {
        "runs": per_gpu,
        "base": base_name,
        "per_gpu_efficiency": {n: r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"] for n, r in per_gpu.items()}
        if base
        else {},
        "same_steps_efficiency": {n: same_steps_efficiency(ours[base_name], ours[n]) for n in per_gpu} if base else {},
        "same_steps_after_warm_up_efficiency": {n: same_steps_efficiency(ours[base_name], ours[n], True)
                                                for n in per_gpu} if base else {},  # fmt: skip
        "one_gpu": runs.get(f"ours_1{compiled}{suffix}{machine}", {}).get("status", "not run"),
    }


def same_steps_efficiency(base: dict, run: dict, after_warm_up: bool = False) -> float | None:
    """Per-GPU efficiency of ``run`` against ``base`` over the base's timed steps, which both trained (the same
    micro-batches): (base GPUs x base seconds) / (run GPUs x run seconds); None without step times.
    ``after_warm_up``: only those of them after the run's own warm-up too (a Trainer's early steps do one-off work).

    >>> base = {"gpus": 1, "warmup": 1, "steps": 2, "step_seconds": [9.0, 8.0, 8.4]}
    >>> round(same_steps_efficiency(base, {"gpus": 4, "step_seconds": [5.0, 2.1, 2.2, 2.0]}), 4)  # 16.4 / (4 x 4.3)
    0.9535
    >>> round(same_steps_efficiency(base, {"gpus": 4, "warmup": 2, "step_seconds": [5.0, 3.0, 2.2, 2.0]}, True), 4)
    0.9545
    """
    first, timed = base.get("warmup"), base.get("steps")
    mine, theirs = base.get("step_seconds"), run.get("step_seconds")
    if None in (first, timed, mine, theirs) or len(theirs) < first + timed or len(mine) < first + timed:
        return None
    steps = slice(max(first, run.get("warmup", 0) if after_warm_up else 0), first + timed)
    if not mine[steps] or None in mine[steps] or None in theirs[steps]:  # a Trainer run has no time for step 0
        return None
    return base["gpus"] * sum(mine[steps]) / (run["gpus"] * sum(theirs[steps]))


def two_gpus(ours: dict) -> dict:
    """Where 2 GPUs lose time against 1 at local batch 2 (the 2-rank plan, one micro-batch per GPU a step): each
    ``ours_2_r2_lb2*`` run (FSDP2's options one at a time) against its 1-GPU replay ``ours_1_r2_lb2`` (``_compile``
    for a compiled run), over the same steps, with its losses and the profiled step's split (``_trace_overlap.py``);
    the Trainer against our loop, and compiled against eager.

    >>> base = {"gpus": 1, "warmup": 1, "steps": 2, "step_seconds": [9, 4.0, 4.0], "tokens_per_s_per_gpu": 8000.0,
    ...         "loss": [12.0, 11.0], "profile": {"compute_ms": 3900.0}}
    >>> two = {"gpus": 2, "warmup": 1, "steps": 2, "step_seconds": [5, 2.2, 2.0], "tokens_per_s_per_gpu": 7600.0,
    ...        "loss": [12.0, 11.001], "reduce_dtype": "float32", "reshard_after_forward": "always", "prefetch": 0}
    >>> out = two_gpus({"ours_1_r2_lb2": base, "ours_2_r2_lb2": two})["runs"]["ours_2_r2_lb2"]
    >>> round(out["same_steps_efficiency"], 4), out["per_gpu_efficiency"], out["losses"]["within_bf16_noise"]
    (0.9524, 0.95, True)
    >>> compiled = two_gpus({"ours_1_r2_lb2": base, "ours_2_r2_lb2_compile": {**two, "compile": True}})["runs"]
    >>> compiled["ours_2_r2_lb2_compile"]["base"] is None  # a compiled run is not compared with an eager replay
    True
    """
    runs = {}
    for name in sorted(n for n in ours if n.startswith("ours_2_r2_lb2")):
        run = ours[name]
        base_name = _replay_of(ours, name)
        base = ours.get(base_name)
        runs[name] = {
            "base": base_name if base else None,
            "tokens_per_s_per_gpu": run["tokens_per_s_per_gpu"],
            "per_gpu_efficiency": run["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"] if base else None,
            "same_steps_efficiency": same_steps_efficiency(base, run) if base else None,
            "options": {k: run.get(k) for k in ("reduce_dtype", "reshard_after_forward", "prefetch", "nccl_max_ctas",
                                                "compile", "compile_as")},
            "profile": run.get("profile"),
            "exposed_ms_per_rank": _exposed_per_rank(run),
            "losses": loss_check(base, run),
        }
    bases = sorted({run["base"] for run in runs.values() if run["base"]})
    rate = lambda name: ours[name]["tokens_per_s_per_gpu"]  # noqa: E731
    return {
        "bases": bases,
        "base_profile": {name: ours[name].get("profile") for name in bases},
        "runs": runs,
        "trainer_vs_loop": {name: rate(name) / rate(loop) for name, loop in _trainer_loops(ours).items() if loop in ours},
        "trainer_compiled_vs_eager": {name: rate(name) / rate(eager) for name in ours if name.startswith(
            "ours_trainer_2_lb2_compile") and (eager := _same_machine(name, "ours_trainer_2_lb2_eager")) in ours},
        # the Trainer at 2 GPUs against the 1-GPU replay (compiled as it is), from the same machine, the same steps
        "trainer_same_steps_efficiency": {name: same_steps_efficiency(ours[base], ours[name]) for name in ours if
                                          name.startswith("ours_trainer_2_lb2") and (base := _same_machine(
                                              name, "ours_1_r2_lb2" + "_compile" * bool(ours[name].get("compile"))))
                                          in ours},  # fmt: skip
        # our loop compiled with the row length symbolic, or as compile_layers compiles, against it compiled as a
        # module with the row length static (--compile-as), on the same GPUs
        "compiled_as_vs_module": {name: rate(name) / rate(module) for name in ours if name.partition("@")[0] in (
            "ours_2_r2_lb2_compile_dynamic", "ours_2_r2_lb2_compile_layers") and (
            module := _same_machine(name, "ours_2_r2_lb2_compile")) in ours},
    }


def _same_machine(name: str, other: str) -> str:
    """``other`` as it is named in ``name``'s folder (``<name>@<folder>``: merge_folders).

    >>> _same_machine("ours_trainer_2_lb2_compile@c", "ours_trainer_2_lb2_eager")
    'ours_trainer_2_lb2_eager@c'
    """
    return other + name[len(name.partition("@")[0]) :]


def _replay_of(ours: dict, name: str) -> str:
    """The 1-GPU replay a 2-GPU diagnosis run compares with: compiled for a compiled run, from the run's own machine
    (its ``@<folder>``) where that machine ran one, else the first machine's.

    >>> ours = {"ours_1_r2_lb2": {}, "ours_1_r2_lb2_compile@c": {}, "ours_2_r2_lb2_compile@c": {"compile": True}}
    >>> _replay_of(ours, "ours_2_r2_lb2_compile@c"), _replay_of(ours, "ours_2_r2_lb2@b")
    ('ours_1_r2_lb2_compile@c', 'ours_1_r2_lb2')
    """
    base = "ours_1_r2_lb2" + "_compile" * bool(ours.get(name, {}).get("compile"))
    own = _same_machine(name, base)
    return own if own in ours else base


def _exposed_per_rank(run: dict) -> list | None:
    """Every rank's exposed communication in the profiled step (ms): ranks wait on each other, so they differ.
    A record with rank 0's ``profile`` alone gives that one.

    >>> _exposed_per_rank({"profile_ranks": [{"comm_exposed_ms": 7.0}, {"comm_exposed_ms": 11.5}]})
    [7.0, 11.5]
    """
    ranks = run.get("profile_ranks") or [run.get("profile")]
    return [r["comm_exposed_ms"] for r in ranks if r] or None


def _trainer_loops(ours: dict) -> dict:
    """Each PackingTrainer run at local batch 2 and our loop run of the same plan on the same machine: runs merged
    from another machine's folder carry its name after an ``@`` (``merge_folders``).

    >>> _trainer_loops({"ours_trainer_2_lb2@b": {}, "ours_trainer_1_lb2": {}, "ours_trainer_2_lb2_compile@c": {}})
    {'ours_trainer_2_lb2@b': 'ours_2_r2_lb2@b', 'ours_trainer_1_lb2': 'ours_1_r1_lb2', 'ours_trainer_2_lb2_compile@c': 'ours_2_r2_lb2_compile@c'}
    """
    loops = {"ours_trainer_2_lb2": "ours_2_r2_lb2", "ours_trainer_2_lb2_eager": "ours_2_r2_lb2",
             "ours_trainer_2_lb2_compile": "ours_2_r2_lb2_compile", "ours_trainer_1_lb2": "ours_1_r1_lb2"}
    out = {}
    for name in ours:
        base, at, machine = name.partition("@")
        if base in loops:
            out[name] = loops[base] + at + machine
    return out


def merge_folders(folders: dict) -> dict:
    """One ``runs`` from several device calls' ``runs`` ({folder name: runs}, in order): the first's under their own
    names, every later folder's under ``<name>@<folder>`` (``env`` and ``commit`` too), so that a later machine's
    runs compare with the first's base without taking its names.

    >>> merge_folders({"a": {"ours_1_r2_lb2": {"x": 1}}, "b": {"ours_1_r2_lb2": {"x": 2}, "commit": {}}})
    {'ours_1_r2_lb2': {'x': 1}, 'ours_1_r2_lb2@b': {'x': 2}, 'commit@b': {}}
    """
    merged, first = {}, True
    for folder, runs in folders.items():
        merged.update(runs if first else {f"{name}@{folder}": run for name, run in runs.items()})
        first = False
    return merged


def _losses(ours: dict, suffix: str, machine: str = "") -> dict:
    """The replays' losses against each 4-GPU run of the same machine (the Trainer's too), eager and compiled apart,
    keyed by the replay for the first (the default, else a keep variant) and ``<replay>:<run>`` for the others; a
    2-GPU machine: the 2-GPU runs against the 1-GPU one.

    >>> ours = {"ours_4_keep_bf16_reduce_lb2@b": {"loss": [12.0]}, "ours_1_lb2@b": {"loss": [12.001]},
    ...         "ours_trainer_4_lb2@b": {"loss": [12.002], "compile": False}}
    >>> {name: check["reference"] for name, check in _losses(ours, "_lb2", "@b").items()}
    {'ours_1_lb2@b': 'ours_4_keep_bf16_reduce_lb2@b', 'ours_1_lb2@b:ours_trainer_4_lb2@b': 'ours_trainer_4_lb2@b'}
    """
    out = {}
    for c in ("", "_compile"):
        fours = [f"ours_4{k}{c}{suffix}{machine}" for k in ("", "_keep", "_keep_bf16_reduce", "_torch_norm")]
        fours += [t for t in (f"ours_trainer_4{suffix}{k}{machine}" for k in TRAINER_4)
                  if bool(ours.get(t, {}).get("compile")) == bool(c)]  # fmt: skip
        fours = [n for n in fours if n in ours] or [f"ours_1{c}{suffix}{machine}"]
        replays = ("ours_2", "ours_2_keep") if fours[0].startswith("ours_1") else ("ours_2", "ours_1")
        for first, reference in zip([True] + [False] * len(fours), fours):
            for replay in (f"{n}{c}{suffix}{machine}" for n in replays):
                if check := loss_check(ours.get(reference), ours.get(replay)):
                    out[replay if first else f"{replay}:{reference}"] = {**check, "reference": reference,
                                                                        "replay": replay}  # fmt: skip
    return out
