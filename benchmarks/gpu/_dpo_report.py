"""dpo_throughput.py's ``--compare``: each packed setting beside TRL's (and shared beside packed), no torch needed.

    <mix>_<setting>_gc_<on|off>.json (one per process)  ->  results.json: a row per (mix, packed | shared, gc)
                                                             README.md: that table, then every setting's figures

Ratios are ours / theirs on the median step's real tokens/s (``packed_vs_trl``: the row's setting / trl, for the
shared row too; ``shared_vs_packed``: shared / packed, the shared row only) and on the whole run's peak allocated
memory (``peak_memory_vs_trl``, ``peak_memory_vs_packed``; None on a CPU run). ``agreement`` compares the row's
steps with trl's, step by step: whether they trained the same pairs (real tokens, pairs and token-id checksums per
step), and per figure (the step's loss; rewards/margins, rewards/chosen, logps/chosen, logps/rejected as logged)
the relative differences |ours - trl| / max(|ours|, |trl|) (0 where both are 0) per step, their max and the max
absolute difference. A setting that failed (its JSON holds ``error``) gives a row with its error and no ratios.
"""

from __future__ import annotations

import json
from pathlib import Path

SIDES = ("packed", "shared")  # the rows; trl is their reference
METRICS = ("rewards/margins", "rewards/chosen", "logps/chosen", "logps/rejected")


def load_runs(folder: Path) -> list[dict]:
    """Every setting's JSON in ``folder`` (results.json left out)."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*_gc_*.json"))]


def ok(run: dict | None) -> bool:
    return run is not None and not run.get("error")


def _ratio(ours, theirs):
    return ours / theirs if ours is not None and theirs else None


def _median(run: dict | None):
    return run["statistics"]["median_tokens_per_s"] if ok(run) else None


def _peak(run: dict | None):
    return run.get("peak_memory_gib") if ok(run) else None


def relative_difference(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|), 0 where both are 0.

    >>> relative_difference(1.0, 1.01), relative_difference(0.0, 0.0), relative_difference(-2.0, 2.0)
    (0.00990099009900991, 0.0, 2.0)
    """
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def _differences(pairs: list[tuple[float, float]]) -> dict:
    relative = [relative_difference(a, b) for a, b in pairs]
    return {
        "per_step_rel": relative,
        "max_rel": max(relative, default=None),
        "max_abs": max((abs(a - b) for a, b in pairs), default=None),
    }


def agreement(ours: dict, theirs: dict) -> dict:
    """Whether ``ours`` trained ``theirs``' pairs step by step, and how far apart their losses and metrics are."""
    n = min(len(ours["steps"]), len(theirs["steps"]))
    key = lambda s: (s["tokens"], s["examples"], s["checksum"])  # noqa: E731
    same = [key(a) == key(b) for a, b in zip(ours["steps"][:n], theirs["steps"][:n])]
    found = {"same_pairs": n > 0 and all(same), "steps_compared": n}
    found["loss"] = _differences([(a["loss"], b["loss"]) for a, b in zip(ours["steps"][:n], theirs["steps"][:n])])
    for name in METRICS:
        pairs = [(a["logged"][name], b["logged"][name]) for a, b in zip(ours["steps"][:n], theirs["steps"][:n])
                 if name in a.get("logged", {}) and name in b.get("logged", {})]  # fmt: skip
        found[name] = _differences(pairs)
    return found


def row(run: dict, trl: dict | None, packed: dict | None) -> dict:
    """One results.json row: ``run`` (packed or shared) beside trl (and beside packed for shared)."""
    stats = run["statistics"] if ok(run) else {}
    found = {
        "mix": run["mix"],
        "setting": run["setting"],
        "name": run["name"],
        "grad_checkpointing": run["grad_checkpointing"],
        "error": run.get("error"),
        "trl_error": None if trl is None else trl.get("error"),
        "pairs_per_batch": run.get("pairs_per_batch"),
        "tokens_per_s": _median(run),
        "trl_tokens_per_s": _median(trl),
        "packed_vs_trl": _ratio(_median(run), _median(trl)),
        "peak_memory_gib": _peak(run),
        "trl_peak_memory_gib": _peak(trl),
        "peak_memory_vs_trl": _ratio(_peak(run), _peak(trl)),
        "mean_tokens_per_step": stats.get("mean_tokens_per_step"),
        "mean_model_tokens_per_step": run.get("mean_model_tokens_per_step"),
        "trl_mean_model_tokens_per_step": trl.get("mean_model_tokens_per_step") if ok(trl) else None,
        "steady_vs_trl": _ratio(stats.get("steady_tokens_per_s"), trl["statistics"]["steady_tokens_per_s"])
        if ok(trl) and stats
        else None,
        "whole_run_vs_trl": _ratio(stats.get("whole_run_tokens_per_s"), trl["statistics"]["whole_run_tokens_per_s"])
        if ok(trl) and stats
        else None,
        "stalls": len(stats["stalls"]) if stats else None,
        "trl_stalls": len(trl["statistics"]["stalls"]) if ok(trl) else None,
        "device": run.get("device"),
    }
    if run["setting"] == "shared":
        found.update(
            packed_tokens_per_s=_median(packed),
            shared_vs_packed=_ratio(_median(run), _median(packed)),
            packed_peak_memory_gib=_peak(packed),
            peak_memory_vs_packed=_ratio(_peak(run), _peak(packed)),
        )
    found["agreement"] = agreement(run, trl) if ok(run) and ok(trl) else None
    return found


def rows(runs: list[dict]) -> list[dict]:
    """A row per packed / shared run (its trl and packed counterparts: same mix and gradient checkpointing)."""
    by = {(r["mix"], r["setting"], r["grad_checkpointing"]): r for r in runs}
    return [
        row(
            r, by.get((r["mix"], "trl", r["grad_checkpointing"])), by.get((r["mix"], "packed", r["grad_checkpointing"]))
        )
        for r in runs
        if r["setting"] in SIDES
    ]


def _fmt(value, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def _error(run: dict) -> str:
    error = run.get("error") or {}
    return f"FAILED ({error.get('type')}: {str(error.get('message', ''))[:160]})".replace("|", "/").replace("\n", " ")


def readme(found: list[dict], runs: list[dict]) -> str:
    """The rows' table, then every setting's own figures (rates, stalls, memory, what ran), then the commands."""
    devices = sorted({r.get("device") or "?" for r in runs})
    versions = next((r["versions"] for r in runs if r.get("versions")), {})
    lines = [
        f"# Packed DPO against TRL {versions.get('trl', '?')}'s DPOTrainer on {', '.join(devices)}",
        "",
        "Written by `benchmarks/gpu/dpo_throughput.py --compare`; one process per setting. Ratios: the median step's "
        "real tokens/s (|P C| + |P R| of the step's pairs, the same for every setting) and the whole run's peak "
        "allocated memory. Agreement with trl: the max relative difference over the steps (loss: the step's; "
        "margins: rewards/margins as logged).",
        "",
        "| mix | setting | grad ckpt | pairs/step | tokens/s | TRL tokens/s | x TRL | x packed | peak GiB | TRL GiB "
        "| memory x TRL | same pairs | loss rel diff | margins rel diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        a = r["agreement"] or {}
        same = {True: "yes", False: "NO"}.get(a.get("same_pairs"), "-")
        status = _error({"error": r["error"]}) if r["error"] else _fmt(r["tokens_per_s"])
        lines.append(
            f"| {r['mix']} | {r['setting']} | {'on' if r['grad_checkpointing'] else 'off'} | {_fmt(r['pairs_per_batch'])} "
            f"| {status} | {_fmt(r['trl_tokens_per_s'])} | {_fmt(r['packed_vs_trl'], '.3f')} "
            f"| {_fmt(r.get('shared_vs_packed'), '.3f')} | {_fmt(r['peak_memory_gib'], '.1f')} "
            f"| {_fmt(r['trl_peak_memory_gib'], '.1f')} | {_fmt(r['peak_memory_vs_trl'], '.3f')} | {same} "
            f"| {_fmt((a.get('loss') or {}).get('max_rel'), '.2e')} "
            f"| {_fmt((a.get('rewards/margins') or {}).get('max_rel'), '.2e')} |"
        )
    lines += ["", "Every setting (stalls: steps slower than twice the median step, by step number):", ""]
    return "\n".join(lines + _settings_table(runs)) + "\n"


_SETTINGS_HEADER = (
    "| run | attention (policy / ref) | real tokens/step | model tokens/step | median tokens/s | steady tokens/s "
    "| whole-run tokens/s | stalls (s) | peak GiB (steps) | FA4 calls with tensor lengths | first losses |"
)


def _settings_table(runs: list[dict]) -> list[str]:
    lines = [_SETTINGS_HEADER, "|" + "---|" * (_SETTINGS_HEADER.count("|") - 1)]
    for run in runs:
        if not ok(run):
            lines.append(f"| {run['name']} | {_error(run)} |" + " |" * (_SETTINGS_HEADER.count("|") - 3))
            continue
        s, fa4 = run["statistics"], run["fa4_int_lengths"]
        stalls = ", ".join(f"{x['step']}: {x['seconds']:.1f}" for x in s["stalls"]) or "none"
        fa4_text = f"{fa4['tensor_lengths']} of {fa4['calls']}" if fa4.get("installed") else "no FA4"
        lines.append(
            f"| {run['name']} | {run['attention']} / {run['ref_attention']} | {_fmt(s['mean_tokens_per_step'])} "
            f"| {_fmt(run['mean_model_tokens_per_step'])} | {_fmt(s['median_tokens_per_s'])} "
            f"| {_fmt(s['steady_tokens_per_s'])} | {_fmt(s['whole_run_tokens_per_s'])} | {stalls} "
            f"| {_fmt(run['peak_memory_gib'], '.1f')} ({_fmt(run['peak_memory_steps_gib'], '.1f')}) | {fa4_text} "
            f"| {', '.join(f'{x:.4f}' for x in run['first_losses'])} |"
        )
    return lines + ["", "Commands:", ""] + [f"    {run['command']}" for run in runs if run.get("command")]


def compare(folder: Path) -> str:
    """Write ``folder``/results.json and README.md from the settings' JSON files there; return the README."""
    runs = load_runs(folder)
    if not runs:
        raise SystemExit(f"{folder}: no <mix>_<setting>_gc_<on|off>.json files (run --setting or --all first)")
    found = rows(runs)
    (folder / "results.json").write_text(json.dumps(found, indent=1) + "\n")
    text = readme(found, runs)
    (folder / "README.md").write_text(text)
    return text
