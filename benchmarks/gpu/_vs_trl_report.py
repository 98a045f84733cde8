"""vs_trl.py's ``--compare``: each of ours' settings beside its TRL counterpart, as results.json and README.md.

    <setting>_<vocab>_gc_<on|off>.json (one per process)  ->  results.json: a row per (ours, TRL) pair of the
                                                             same vocabulary and gradient checkpointing
                                                              README.md: that table, then every setting's figures

A row's ratios are ours / TRL's: ``tokens_per_s_vs_trl`` on the median step's tokens/s, ``peak_memory_vs_trl``
on the whole run's peak allocated memory (None on a CPU run, which has none), ``first_step_vs_trl`` on
``first_step_s`` (process start to the end of step 1: below 1 means ours trains its first step sooner). The flattening pair trains the
same batches: its row also says whether their tokens and token-id checksums match step by step, and how far
apart their first losses are.
"""

from __future__ import annotations

import json
from pathlib import Path

PAIRS = {"ours_packing": "trl_bfd", "ours_flattening": "trl_padding_free", "ours_auto": "trl_auto_cap"}
FIRST = 3  # the first losses compared (step 1 is before any update: the same weights and batch on both sides)
LOSS_TOLERANCE = {True: 1e-4, False: 2e-2}  # step 1's loss, the same batch on both sides: float32 (smoke), bf16


def load_runs(folder: Path) -> list[dict]:
    """Every setting's JSON in ``folder`` (results.json left out)."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*_gc_*.json"))]


def _ratio(ours, theirs):
    return ours / theirs if ours is not None and theirs else None


def _same_batches(ours: dict, theirs: dict) -> dict:
    """Whether two runs trained the same batches (tokens, checksums per step) and how close their first losses are."""
    n = min(len(ours["steps"]), len(theirs["steps"]))
    key = lambda s: (s["tokens"], s["examples"], s["checksum"])  # noqa: E731
    same = [key(a) == key(b) for a, b in zip(ours["steps"][:n], theirs["steps"][:n])]
    gaps = [abs(a["loss"] - b["loss"]) for a, b in zip(ours["steps"][:FIRST], theirs["steps"][:FIRST])]
    tolerance = LOSS_TOLERANCE[bool(ours["smoke"])]
    return {
        "same_batches": all(same) and n > 0,
        "steps_compared": n,
        "first_loss_abs_diff": gaps[0] if gaps else None,
        "first_loss_tolerance": tolerance,
        "first_loss_equal": bool(gaps) and gaps[0] <= tolerance,
        "first_losses_max_abs_diff": max(gaps, default=None),
    }


def pair_row(ours: dict, theirs: dict) -> dict:
    """One results.json row: ours beside TRL, both raw figures and the two ratios (ours / TRL)."""
    a, b = ours["statistics"], theirs["statistics"]
    row = {
        "setting": ours["name"],
        "vs": theirs["name"],
        "vocab": ours["vocab"],
        "grad_checkpointing": ours["grad_checkpointing"],
        "compiled": ours.get("compiled", False),
        "tokens_per_s": a["median_tokens_per_s"],
        "trl_tokens_per_s": b["median_tokens_per_s"],
        "tokens_per_s_vs_trl": _ratio(a["median_tokens_per_s"], b["median_tokens_per_s"]),
        "peak_memory_gib": ours["peak_memory_gib"],
        "trl_peak_memory_gib": theirs["peak_memory_gib"],
        "peak_memory_vs_trl": _ratio(ours["peak_memory_gib"], theirs["peak_memory_gib"]),
        "steady_tokens_per_s_vs_trl": _ratio(a["steady_tokens_per_s"], b["steady_tokens_per_s"]),
        "whole_run_tokens_per_s_vs_trl": _ratio(a["whole_run_tokens_per_s"], b["whole_run_tokens_per_s"]),
        "peak_memory_steps_vs_trl": _ratio(ours["peak_memory_steps_gib"], theirs["peak_memory_steps_gib"]),
        "first_step_s": ours.get("first_step_s"),
        "trl_first_step_s": theirs.get("first_step_s"),
        "first_step_vs_trl": _ratio(ours.get("first_step_s"), theirs.get("first_step_s")),
        "first_step_phases_s": ours.get("first_step_phases_s"),
        "trl_first_step_phases_s": theirs.get("first_step_phases_s"),
        "mean_tokens_per_step": a["mean_tokens_per_step"],
        "trl_mean_tokens_per_step": b["mean_tokens_per_step"],
        "trl_stalls": len(b["stalls"]),
        "stalls": len(a["stalls"]),
        "first_losses": ours["first_losses"],
        "trl_first_losses": theirs["first_losses"],
        "device": ours["device"],
    }
    if ours["setting"] == "ours_flattening":
        row.update(_same_batches(ours, theirs))
    return row


def pair_rows(runs: list[dict]) -> list[dict]:
    """A row per ours run whose TRL counterpart (same vocabulary, gradient checkpointing, compile and memory cap) ran too."""
    key = lambda r: (r["vocab"], r["grad_checkpointing"], r.get("compiled", False), _cap(r))  # noqa: E731
    trl = {(r["setting"], *key(r)): r for r in runs if r["side"] == "trl"}
    rows = []
    for run in (r for r in runs if r["side"] == "ours"):
        theirs = trl.get((PAIRS[run["setting"]], *key(run)))
        if theirs is not None:
            rows.append(pair_row(run, theirs))
    return rows


def _cap(run: dict):
    """The run's --memory-cap-gib (None: the whole card): capped runs pair only with runs under the same cap."""
    return (run.get("options") or {}).get("memory_cap_gib")


def _compiled(mode) -> str:
    """The table's compile column: both sides compiled, each side's default (ours' layers, TRL eager), or neither."""
    return {True: "both", "defaults": "defaults (ours' layers; TRL eager)"}.get(mode, "no")


def _fmt(value, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def readme(rows: list[dict], runs: list[dict]) -> str:
    """The pairs' table, then every setting's own figures (rates, stalls, memory, what ran)."""
    devices = sorted({r["device"] for r in runs})
    lines = [
        f"# This library against TRL {runs[0]['versions'].get('trl') if runs else '?'} on {', '.join(devices)}",
        "",
        "Written by `benchmarks/gpu/vs_trl.py --compare`; one process per setting. Ratios are ours / TRL's: the "
        "median step's real tokens/s, the whole run's peak allocated memory.",
        "",
        "| ours | TRL | vocab | grad ckpt | compiled | tokens/s ours | tokens/s TRL | x TRL | peak GiB ours "
        "| peak GiB TRL | memory x TRL | first step s ours | first step s TRL | same batches | step-1 loss diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        same = {True: "yes", False: "NO"}.get(r.get("same_batches"), "-")
        same += "" if r.get("first_loss_equal", True) else " (step-1 losses differ)"
        lines.append(
            f"| {r['setting']} | {r['vs']} | {r['vocab']} | {'on' if r['grad_checkpointing'] else 'off'} "
            f"| {_compiled(r.get('compiled'))} | {_fmt(r['tokens_per_s'])} | {_fmt(r['trl_tokens_per_s'])} | {_fmt(r['tokens_per_s_vs_trl'], '.3f')} "
            f"| {_fmt(r['peak_memory_gib'], '.1f')} | {_fmt(r['trl_peak_memory_gib'], '.1f')} "
            f"| {_fmt(r['peak_memory_vs_trl'], '.3f')} | {_fmt(r['first_step_s'], '.1f')} | {_fmt(r['trl_first_step_s'], '.1f')} "
            f"| {same} | {_fmt(r.get('first_loss_abs_diff'), '.2e')} |"
        )
    lines += ["", "Every setting (stalls: steps slower than twice the median step, by step number):", ""]
    return "\n".join(lines + _settings_table(runs)) + "\n"


_SETTINGS_HEADER = (
    "| setting | vocab | grad ckpt | attention | loss | tokens/step | median tokens/s | steady tokens/s "
    "| whole-run tokens/s | stalls (s) | peak GiB (steps) | FA4 calls with tensor lengths | first losses |"
)


def _settings_table(runs: list[dict]) -> list[str]:
    lines = [_SETTINGS_HEADER, "|" + "---|" * (_SETTINGS_HEADER.count("|") - 1)]
    for run in runs:
        s, fa4 = run["statistics"], run["fa4_int_lengths"]
        stalls = ", ".join(f"{x['step']}: {x['seconds']:.1f}" for x in s["stalls"]) or "none"
        fa4_text = f"{fa4['tensor_lengths']} of {fa4['calls']}" if fa4.get("installed") else "no FA4"
        lines.append(
            f"| {run['name']} | {run['vocab']} | {'on' if run['grad_checkpointing'] else 'off'} | {run['attention']} "
            f"| {run['loss']} | {_fmt(s['mean_tokens_per_step'])} | {_fmt(s['median_tokens_per_s'])} "
            f"| {_fmt(s['steady_tokens_per_s'])} | {_fmt(s['whole_run_tokens_per_s'])} | {stalls} "
            f"| {_fmt(run['peak_memory_gib'], '.1f')} ({_fmt(run['peak_memory_steps_gib'], '.1f')}) | {fa4_text} "
            f"| {', '.join(f'{x:.4f}' for x in run['first_losses'])} |"
        )
    return lines + ["", "Commands:", ""] + [f"    {run['command']}" for run in runs]


def compare(folder: Path) -> str:
    """Write ``folder``/results.json and README.md from the settings' JSON files there; return the README."""
    runs = load_runs(folder)
    if not runs:
        raise SystemExit(f"{folder}: no <setting>_<vocab>_gc_<on|off>.json files (run --setting or --all first)")
    rows = pair_rows(runs)
    (folder / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = readme(rows, runs)
    (folder / "README.md").write_text(text)
    return text
