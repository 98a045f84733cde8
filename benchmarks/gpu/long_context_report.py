"""Long-context training throughput on H100, collected: one table and one plot (issue #18, items 2 and 5).

Reads the committed long-context runs of ``train_throughput.py`` (1B Llama-style, bf16, gradient
checkpointing, one NVIDIA H100 80GB HBM3 per run) under --results, laid out as

    SESSION/NAME/results.json   a run's results; train_throughput.py writes it after every run
    SESSION/NAME.log            its log; parsed only where no results.json exists (the first runs
                                were cut by the device call's time limit before the script wrote it)

A log line reads ``<dist> <mode> <attn> <N,NNN> tok/s  pad X%  loss L  mem M GiB``; per mode|attn
the rounds' tokens/s are collected and the median round reported (all its numbers), taking the
lower middle of an even count, as train_throughput.py's ``median_round`` does. A log carries no
command: those of the three log-only runs are written below (LOG_ONLY).

Cases are (distribution, max length): long_tail at 2,048 / 8,192 / 32,768 and reasoning at 32,768.
Ratios are computed within one run only, never across runs (runs differ in steps and warm-up):

    FA4 / uniform           multipack|flash_attention_4 over the oracle of rows of the mean length,
                            under FA4 where that run has it, else sdpa (labelled)
    FA4 / uniform_work      the same over the same-work oracle (rows of sum(l^2)/sum(l): the data's
                            tokens and attention FLOPs, unpacked); same kernel rule
    FA4 / padded_grouped, FA4 / padded_random, FA4 / packing_varlen

A case's primary run is the one with the most of these ratios, then the most of them with an FA4
oracle, then the most rounds summed over its modes: among runs with the same ratios, one that
completed 3 rounds of every mode (the issue's bar asks for medians of >= 3 rounds) outranks one the
device call's time limit cut to 1-2 rounds in some modes (so session4's 3-round 32k runs are primary
over session2's). The others are shown beside it with their folder, in that order. The plot draws
each mode of a case from its primary run, else from the next run that measured that mode.

Writes OUT/long_context.md (tables, the issue's bar lines, sources and commands), OUT/long_context.json
and OUT/long_context.png (tokens/s and peak memory against max length), and prints the markdown.
CPU only: it reads files, it runs no model.

Usage: python benchmarks/gpu/long_context_report.py   (regenerates benchmarks/results/long_context_h100)
       python benchmarks/gpu/long_context_report.py --results DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import median_round  # noqa: E402

HERE = Path(__file__).resolve().parents[1]  # benchmarks/
DEFAULT = HERE / "results" / "long_context_h100"
MODEL = "1B Llama-style (hidden 2048, 16 layers, GQA 32/8), bf16, gradient checkpointing"

FA4, VARLEN = "flash_attention_4", "packing_varlen"
COLUMNS = (  # the table's mode|attn columns, in order
    "padded_random|sdpa",
    "padded_grouped|sdpa",
    f"multipack|{FA4}",
    f"multipack|{VARLEN}",
    "uniform|sdpa",
    f"uniform|{FA4}",
    "uniform_work|sdpa",
    f"uniform_work|{FA4}",
)
SHORT = {"sdpa": "sdpa", FA4: "FA4", VARLEN: "varlen"}
CASES = (("long_tail", 2048), ("long_tail", 8192), ("long_tail", 32768), ("reasoning", 32768))
RATIOS = ("vs_uniform", "vs_uniform_work", "vs_padded_grouped", "vs_padded_random", "vs_packing_varlen")
BAR_ORACLE, BAR_GROUPED = 0.97, 3.0

_BASE = (  # session1/long_tail_8k's command (results.json); the log-only runs changed only these options
    "python benchmarks/gpu/train_throughput.py --size 1b --grad-checkpointing --distributions long_tail "
    "--modes padded_random,padded_grouped,multipack,uniform,uniform_work --attn flash_attention_4,packing_varlen "
    "--steps 4 --warmup 2 --eval-every 0 --rounds 3 --tokens-per-step 32768 --micro-tokens 32768 "
    "--max-length 8192 --batch-size 4 --examples 4000 --out /root/out/long_tail_8k"
)
_32K = {"--tokens-per-step": "65536", "--micro-tokens": "65536", "--max-length": "32768", "--batch-size": "2"}
LOG_ONLY = {  # log name -> options changed from _BASE (a log does not record its command)
    "session1/long_tail_2k.log": {"--max-length": "2048", "--batch-size": "16", "--examples": "6000"},
    "session1/long_tail_32k.log": {**_32K, "--examples": "3000"},
    "session1/reasoning_32k.log": {**_32K, "--distributions": "reasoning", "--examples": "1500"},
}
NOTES = {  # what the files do not say: the machine, and where the device call's time limit cut a run
    "session1/long_tail_2k.log": "1-GPU machine; cut at 150 s (log only)",
    "session1/long_tail_8k": "1-GPU machine; complete",
    "session1/long_tail_32k.log": "1-GPU machine; cut at 330 s (log only)",
    "session1/reasoning_32k.log": "1-GPU machine; cut at 230 s (log only)",
    "session2/long_tail_32k": "2-GPU machine, GPU 0; cut at 430 s",
    "session2/reasoning_32k": "2-GPU machine, GPU 1; cut at 250 s",
    "session2/long_tail_8k_fa4_oracle": "2-GPU machine, GPU 1 after reasoning_32k; complete",
    "session3/reasoning_32k_r3": "1-GPU machine; cut at 215 s",
    "session3/long_tail_32k_fa4_oracle": "1-GPU machine; cut at 100 s",
    "session4/long_tail_32k": "complete: 3 rounds of every mode",
    "session4/reasoning_32k": "complete: 3 rounds of every mode",
}
LOG_LINE = re.compile(
    r"^(?P<dist>\S+)\s+(?P<mode>\S+)\s+(?P<attn>\S+)\s+(?P<tps>[\d,]+) tok/s\s+pad (?P<pad>[\d.]+)%"
    r"\s+loss (?P<loss>[\d.]+)\s+mem (?P<mem>[\d.]+) GiB$"
)


# ----------------------------------------------------------------------------- reading
def option(command: str, name: str) -> str:
    words = shlex.split(command)
    return words[words.index(name) + 1]


def with_options(command: str, changes: dict[str, str]) -> str:
    words = shlex.split(command)
    for name, value in changes.items():
        words[words.index(name) + 1] = value
    return " ".join(words)


def parse_log(path: Path) -> dict[str, dict[str, list[dict]]]:
    """{dist: {mode|attn: [round, ...]}} from a train_throughput.py log, rounds in log order."""
    runs: dict[str, dict[str, list[dict]]] = {}
    for line in path.read_text().splitlines():
        if match := LOG_LINE.match(line.strip()):
            rounds = runs.setdefault(match["dist"], {}).setdefault(f"{match['mode']}|{match['attn']}", [])
            rounds.append(
                {
                    "real_tokens_per_s": float(match["tps"].replace(",", "")),
                    "padding_fraction": float(match["pad"]) / 100,
                    "peak_memory_gib": float(match["mem"]),
                    "final_loss": float(match["loss"]),
                }
            )
    return runs


def summarise(mode: dict) -> dict:
    keep = ("real_tokens_per_s", "rounds_tokens_per_s", "peak_memory_gib", "padding_fraction")
    extra = ("fa4_compiles_timed", "achieved_tflops")
    return {**{k: mode[k] for k in keep}, "rounds": len(mode["rounds_tokens_per_s"]), **{k: mode.get(k) for k in extra}}


def run_record(name: str, card: str, command: str, source: str, dist: str, modes: dict) -> dict:
    return {
        "run": name,
        "source": source,
        "card": card,
        "command": command,
        "distribution": dist,
        "max_length": int(option(command, "--max-length")),
        "steps": int(option(command, "--steps")),
        "warmup": int(option(command, "--warmup")),
        "note": NOTES.get(name, ""),
        "modes": {key: summarise(m) for key, m in modes.items()},
    }


def log_check(path: Path, dist: str, modes: dict) -> list[str]:
    """Differences between a run's log and its results.json (rounds' tokens/s), if its log exists."""
    if not path.exists():
        return []
    logged = parse_log(path).get(dist, {})
    problems = []
    for key, mode in modes.items():
        want = [round(x) for x in mode["rounds_tokens_per_s"]]
        got = [round(r["real_tokens_per_s"]) for r in logged.get(key, [])]
        if got != want:
            problems.append(f"{path.name} {key}: log {got} vs results.json {want}")
    return problems


def read_runs(folder: Path) -> tuple[list[dict], list[str]]:
    """Every run under folder: results.json files, then the logs that have none."""
    runs, problems = [], []
    for path in sorted(folder.glob("*/*/results.json")):
        name = path.parent.relative_to(folder).as_posix()
        data = json.loads(path.read_text())
        for dist, modes in data["results"].items():
            runs.append(run_record(name, data["card"], data["args"]["command"], "results.json", dist, modes))
            problems += log_check(path.parent.with_suffix(".log"), dist, modes)
    cards = {r["run"].split("/")[0]: r["card"] for r in runs}
    for path in sorted(folder.glob("*/*.log")):
        name = path.relative_to(folder).as_posix()
        if path.with_suffix("").joinpath("results.json").exists():
            continue
        if name not in LOG_ONLY:
            problems.append(f"{name}: a log without results.json and without a command in LOG_ONLY: skipped")
            continue
        command = with_options(_BASE, {**LOG_ONLY[name], "--out": f"/root/out/{path.stem}"})
        card = cards.get(name.split("/")[0], "?")
        for dist, modes in parse_log(path).items():
            runs.append(run_record(name, card, command, "log", dist, {k: median_round(v) for k, v in modes.items()}))
    return sorted(runs, key=lambda r: r["run"]), problems


# ----------------------------------------------------------------------------- ratios
def tps(run: dict, key: str) -> float | None:
    return run["modes"].get(key, {}).get("real_tokens_per_s")


def ratios(run: dict) -> dict[str, dict]:
    """The issue's ratios within this run: {name: {"value", "num", "den", "against"}} where measured."""
    packed = tps(run, f"multipack|{FA4}")
    if packed is None:
        return {}
    against = {"vs_padded_grouped": "padded_grouped|sdpa", "vs_padded_random": "padded_random|sdpa"}
    against["vs_packing_varlen"] = f"multipack|{VARLEN}"
    for oracle in ("uniform", "uniform_work"):  # the same kernel as the packed run where measured, else sdpa
        key = f"{oracle}|{FA4}" if f"{oracle}|{FA4}" in run["modes"] else f"{oracle}|sdpa"
        against[f"vs_{oracle}"] = key
    out = {}
    for name in RATIOS:
        base = tps(run, against[name])
        if base:
            rounds = (run["modes"][f"multipack|{FA4}"]["rounds"], run["modes"][against[name]]["rounds"])
            out[name] = {"value": packed / base, "num": packed, "den": base, "against": against[name], "rounds": rounds}
    return out


def flops_ratio(run: dict, oracle_mode: str = "uniform") -> dict | None:
    """Packed FA4's model FLOPs/s over an oracle's (same kernel rule), where both have them.

    The FLOPs are train_throughput.py's ``achieved_tflops`` (6 x parameters per token plus each
    example's own causal attention): a ratio of work done per second, where the tokens/s ratio
    is held below 1 by the extra attention long examples carry. Against the same-work oracle it
    also removes the sampling noise of the timed steps: their attention per token differs from
    the whole dataset's, which sets the oracle's row length.
    """
    packed = run["modes"].get(f"multipack|{FA4}", {}).get("achieved_tflops")
    key = f"{oracle_mode}|{FA4}" if f"{oracle_mode}|{FA4}" in run["modes"] else f"{oracle_mode}|sdpa"
    oracle = run["modes"].get(key, {}).get("achieved_tflops")
    return {"value": packed / oracle, "num": packed, "den": oracle, "against": key} if packed and oracle else None


def score(run: dict) -> tuple[int, int, int]:
    """Primary-run order: most ratios, then most with an FA4 oracle, then most rounds summed over modes.

    The last key makes a run that completed every round outrank a cut repeat of the same ratios.
    """
    found = ratios(run)
    fa4_oracles = sum(1 for r in found.values() if r["against"].endswith(FA4) and r["against"].startswith("uniform"))
    return len(found), fa4_oracles, sum(m["rounds"] for m in run["modes"].values())


def build_cases(runs: list[dict]) -> dict[str, dict]:
    cases = {}
    for dist, length in CASES:
        members = sorted(
            (r for r in runs if (r["distribution"], r["max_length"]) == (dist, length)), key=score, reverse=True
        )
        if not members:
            continue
        primary = members[0]
        merged = {}  # per mode: the primary run's numbers, else the next run's that measured it
        for run in reversed(members):
            merged.update({k: {**m, "run": run["run"]} for k, m in run["modes"].items()})
        cases[f"{dist}@{length}"] = {
            "distribution": dist,
            "max_length": length,
            "primary": primary["run"],
            "runs": [r["run"] for r in members],
            "roles": {r["run"]: role(r, primary) for r in members},
            "ratios": {r["run"]: ratios(r) for r in members},
            "modes": merged,
        }
    return cases


def role(run: dict, primary: dict) -> str:
    if run is primary:
        return "primary"
    mine, theirs = ratios(run), ratios(primary)
    adds = [
        n
        for n, r in mine.items()
        if r["against"].endswith(FA4) and not theirs.get(n, {}).get("against", "").endswith(FA4)
    ]
    return "adds the FA4 oracles" if adds else "repeat"


# ----------------------------------------------------------------------------- bar
def bar_lines(cases: dict) -> list[dict]:
    lines = []
    for case_name, case in cases.items():
        dist, length = case["distribution"], case["max_length"]
        for run in case["runs"]:
            found = case["ratios"][run]
            oracle, work = found.get("vs_uniform"), found.get("vs_uniform_work")
            if length in (8192, 32768) and oracle and oracle["against"].endswith(FA4):
                lines.append(oracle_line(case_name, run, oracle, work, in_bar=dist == "long_tail"))
            grouped = found.get("vs_padded_grouped")
            if dist == "long_tail" and grouped:
                lines.append(
                    {"bar": "grouped", "case": case_name, "run": run, **grouped, "met": grouped["value"] >= BAR_GROUPED}
                )
    return lines


def oracle_line(case_name: str, run: str, oracle: dict, work: dict | None, *, in_bar: bool) -> dict:
    line = {"bar": "oracle", "case": case_name, "run": run, **oracle, "met": oracle["value"] >= BAR_ORACLE}
    line["in_bar"] = in_bar  # the bar names 8k and 32k (long_tail); reasoning is shown beside it
    if work:
        line["same_work"] = work
    return line


def fraction(ratio: dict) -> str:
    """``num (rounds) / den (rounds)``: the two medians a ratio divides."""
    (a, b), (ra, rb) = (ratio["num"], ratio["den"]), ratio["rounds"]
    return f"{a:,.0f} ({ra}) / {b:,.0f} ({rb})"


def bar_text(line: dict) -> str:
    verdict = "met" if line["met"] else "NOT met"
    if line["bar"] == "grouped":
        return (
            f"- {case_label(line['case'])}: **{verdict}**: {line['value']:.2f}x "
            f"({fraction(line)} tok/s, `{line['run']}`)"
        )
    text = (
        f"- {case_label(line['case'])}{'' if line['in_bar'] else ' (beside the bar)'}: **{verdict}**: "
        f"{line['value']:.1%} ({fraction(line)} tok/s, `{line['run']}`)"
    )
    if work := line.get("same_work"):
        kernel, verdict = SHORT[work["against"].split("|")[1]], ">=" if work["value"] >= BAR_ORACLE else "<"
        text += (
            f"; against the same-work oracle ({kernel}): {work['value']:.1%} "
            f"({verdict} {BAR_ORACLE:.0%}; {fraction(work)})"
        )
    return text


# ----------------------------------------------------------------------------- report
def case_label(name: str) -> str:
    dist, length = name.split("@")
    return f"{dist} @ {int(length):,}"


def header(key: str) -> str:
    mode, attn = key.split("|")
    return f"{mode} {SHORT[attn]}"


def cell_tps(mode: dict | None) -> str:
    return "" if mode is None else f"{mode['real_tokens_per_s']:,.0f} ({mode['rounds']})"


def cell_ratio(found: dict, name: str) -> str:
    r = found.get(name)
    if r is None:
        return ""
    if name in ("vs_uniform", "vs_uniform_work"):
        return f"{r['value']:.1%} ({SHORT[r['against'].split('|')[1]]})"
    return f"{r['value']:.2f}x"


def tables(cases: dict, by_name: dict) -> list[str]:
    head = "| case | run | " + " | ".join(header(k) for k in COLUMNS) + " |"
    rule = "|---|---|" + "---:|" * len(COLUMNS)
    speed, memory = [head, rule], [head, rule]
    ratio = [
        "| case | run | role | FA4 / uniform | FA4 / uniform_work | FA4 / padded_grouped | FA4 / padded_random "
        "| FA4 / packing_varlen | FA4 / uniform in model FLOPs/s | FA4 / uniform_work in model FLOPs/s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, case in cases.items():
        for run in case["runs"]:
            modes = by_name[run, case["distribution"]]["modes"]
            start = f"| {case_label(name)} | `{run}` | "
            speed.append(start + " | ".join(cell_tps(modes.get(k)) for k in COLUMNS) + " |")
            memory.append(start + " | ".join(mem_cell(modes.get(k)) for k in COLUMNS) + " |")
            found = case["ratios"][run]
            flops = [flops_ratio(by_name[run, case["distribution"]], o) for o in ("uniform", "uniform_work")]
            flops_cells = " | ".join(
                "" if f is None else f"{f['value']:.1%} ({SHORT[f['against'].split('|')[1]]})" for f in flops
            )
            cells = " | ".join(cell_ratio(found, n) for n in RATIOS)
            ratio.append(start + f"{case['roles'][run]} | {cells} | {flops_cells} |")
    return [
        "### Real tokens/s: median round (rounds measured)",
        "",
        *speed,
        "",
        "### Ratios, each within one run",
        "",
        *ratio,
        "",
        "### Peak memory (GiB, the median round's)",
        "",
        *memory,
    ]


def mem_cell(mode: dict | None) -> str:
    return "" if mode is None else f"{mode['peak_memory_gib']:.1f}"


def markdown(runs: list[dict], cases: dict, bars: list[dict], problems: list[str]) -> str:
    by_name = {(r["run"], r["distribution"]): r for r in runs}
    cards = sorted({r["card"] for r in runs})
    compiles = [
        m["fa4_compiles_timed"] for r in runs for m in r["modes"].values() if m["fa4_compiles_timed"] is not None
    ]
    lines = [
        f"## Long-context training throughput: {MODEL}, {', '.join(cards)}",
        "",
        "Real (non-pad) tokens/s per mode|attention, from `benchmarks/gpu/train_throughput.py` runs of 1 GPU each, "
        "collected by `python benchmarks/gpu/long_context_report.py`. A mode's number is its median round (the lower "
        "middle of an even count, as train_throughput.py's `median_round`); the rounds measured are in brackets: "
        "runs cut by the device call's time limit have 1-2. Ratios are taken within one run only (runs differ in "
        "steps and warm-up). `uniform`: rows of the mean length; `uniform_work`: rows of sum(l^2)/sum(l), the data's "
        "tokens and attention FLOPs without packing. An oracle ratio uses the oracle under FA4 where that run has it, "
        "else under sdpa (the kernel is named in brackets). Each case's primary run (listed first) has the most of these "
        "ratios, then the most of them against an FA4 oracle, then the most rounds summed over its modes (a run of 3 "
        "rounds in every mode outranks a cut one); `adds the FA4 oracles` rows supply the same-kernel oracle ratios, "
        "`repeat` rows are other runs of the case.",
        "",
        *tables(cases, by_name),
        "",
        "### Bar (issue #18)",
        "",
        "Every run that measured a ratio, each ratio within its run; tokens/s are medians, rounds in brackets.",
        "",
        f"Packed FA4 >= {BAR_ORACLE:.0%} of the uniform oracle with FA4 at 8k and 32k. The mean-length oracle does "
        "less attention per token than long-tailed data (sum(l^2)/sum(l) > mean), so the same-work ratio is shown too:",
        "",
        *[bar_text(b) for b in bars if b["bar"] == "oracle"],
        "",
        f"Packed FA4 >= {BAR_GROUPED:.0f}x padded_grouped on long_tail:",
        "",
        *[bar_text(b) for b in bars if b["bar"] == "grouped"],
        "",
        f"FA4 compiles in timed steps: {sum(compiles)} over the {len(compiles)} mode|attn results of the results.json "
        "runs (the logs do not record it).",
        "",
        "### Runs",
        "",
        "| run | source | distribution | max length | steps + warm-up | machine, cut | command |",
        "|---|---|---|---:|---|---|---|",
        *[
            f"| `{r['run']}` | {r['source']} | {r['distribution']} | {r['max_length']:,} | {r['steps']} + {r['warmup']} "
            f"| {r['note']} | `{r['command']}` |"
            for r in runs
        ],
        "",
        "Commands of the log-only runs are session1/long_tail_8k's with the options LOG_ONLY in the script names "
        "(a log does not record its command). The plot `long_context.png` draws each mode from the case's primary "
        "run, else from the next run that measured it (the FA4 oracles at 8,192: `session2/long_tail_8k_fa4_oracle`).",
    ]
    if problems:
        lines += ["", "Checks of logs against results.json:", "", *[f"- {p}" for p in problems]]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- plot
STYLE = {  # mode|attn -> colour, line style
    "padded_random|sdpa": ("tab:red", "-"),
    "padded_grouped|sdpa": ("tab:orange", "-"),
    f"multipack|{FA4}": ("tab:blue", "-"),
    f"multipack|{VARLEN}": ("tab:cyan", "-"),
    "uniform|sdpa": ("tab:green", "-"),
    f"uniform|{FA4}": ("tab:green", "--"),
    "uniform_work|sdpa": ("tab:purple", "-"),
    f"uniform_work|{FA4}": ("tab:purple", "--"),
}


def plot(cases: dict, card: str, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    long_tail = [c for c in cases.values() if c["distribution"] == "long_tail"]
    reasoning = [c for c in cases.values() if c["distribution"] == "reasoning"]
    for ax, field, scale, label in (
        (axes[0], "real_tokens_per_s", 1e3, "real tokens/s (thousands)"),
        (axes[1], "peak_memory_gib", 1, "peak memory (GiB)"),
    ):
        for key, (colour, dash) in STYLE.items():
            points = [(c["max_length"], c["modes"][key][field] / scale) for c in long_tail if key in c["modes"]]
            if points:
                ax.plot(*zip(*points), dash, marker="o", color=colour, label=f"long_tail: {header(key)}")
            for case in reasoning:
                if key in case["modes"]:
                    x = case["max_length"] * 1.12  # beside long_tail's 32k points
                    ax.plot(
                        x,
                        case["modes"][key][field] / scale,
                        "*",
                        markersize=12,
                        color=colour,
                        mfc="none" if "--" in dash else colour,
                    )
        ax.set_xscale("log", base=2)
        ax.set_xticks([2048, 8192, 32768], ["2k", "8k", "32k"])
        ax.set_xlabel("max length (tokens); stars: reasoning at 32k")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", handlelength=4)  # the memory panel's upper left is empty
    fig.suptitle(f"Long-context training, {MODEL}, 1x {card}")
    fig.tight_layout()
    fig.savefig(out / "long_context.png", dpi=90)


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=DEFAULT, help="folder of the session*/ runs")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: --results)")
    args = parser.parse_args()
    out = args.out or args.results
    out.mkdir(parents=True, exist_ok=True)
    runs, problems = read_runs(args.results)
    cases = build_cases(runs)
    bars = bar_lines(cases)
    text = markdown(runs, cases, bars, problems)
    (out / "long_context.md").write_text(text)
    data = {"model": MODEL, "cards": sorted({r["card"] for r in runs}), "runs": runs, "cases": cases, "bar": bars}
    (out / "long_context.json").write_text(json.dumps(data, indent=1))
    plot(cases, runs[0]["card"], out)
    print(text)


if __name__ == "__main__":
    main()
