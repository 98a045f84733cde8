"""train_throughput.py's report: the markdown tables (every mode against padding and the oracles) and results.json."""

from __future__ import annotations

import json

import numpy as np
import torch

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12}


def card_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def mfu(tflops: float) -> float | None:
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in card_name():
            return tflops * 1e12 / peak
    return None


def report(results: dict, args, out_of_memory: dict | None = None) -> str:
    lines = [
        f"## Training throughput: {args.size} Llama-style, bf16, {card_name()}",
        "",
        f"{args.steps} timed steps after {args.warmup} warm-up"
        + (" (timed back to back as one span)" if args.timing == "window" else " (each synchronised)")
        + f", median of {args.rounds} alternating round(s), "
        f"~{args.tokens_per_step} tokens per step, "
        f"max length {args.max_length}"
        + (", gradient checkpointing" if args.grad_checkpointing else "")
        + f". Command: `{args.command}`",
        "",
    ]
    for dist, modes in results.items():
        ref = modes.get("padded_random|sdpa", {}).get("real_tokens_per_s")
        grouped = modes.get("padded_grouped|sdpa", {}).get("real_tokens_per_s")

        def ceiling(name: str, attn: str) -> float | None:  # the oracle under the same attention, else sdpa's
            return (modes.get(f"{name}|{attn}") or modes.get(f"{name}|sdpa") or {}).get("real_tokens_per_s")

        lines += [
            f"### {dist}",
            "",
            "| mode | attention | real tokens/s | vs padded | vs grouped | vs oracle | vs same-work oracle | MFU "
            "| host issue | peak GiB | padding | final loss |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key, r in modes.items():
            mode, attn = key.split("|")
            tps = r["real_tokens_per_s"]
            oracle, work = ceiling("uniform", attn), ceiling("uniform_work", attn)
            m, mem = mfu(r["achieved_tflops"]), r["peak_memory_gib"]
            m_text = "" if m is None else f"{m:.1%}"
            mem_text = "" if mem is None else f"{mem:.1f}"
            share = r.get("host_issue_share")  # absent from runs before it was recorded
            issue = "" if share is None else f"{share:.0%}"
            ratio = lambda base, fmt: "" if not base else format(tps / base, fmt)  # noqa: E731
            lines.append(
                f"| {mode} | {attn} | {tps:,.0f} | {ratio(ref, '.2f')}x | {ratio(grouped, '.2f')}x | {ratio(oracle, '.1%')} | "
                f"{ratio(work, '.1%')} | "
                f"{m_text} | {issue} | {mem_text} | {r['padding_fraction']:.1%} | {r['train_loss'][-1]:.4f} |"
            )
        lines += oracle_table(modes)
        if "flattened|" + args.attn[0] in modes and "padded_random|sdpa" in modes:
            a = np.array(modes["padded_random|sdpa"]["train_loss"])
            b = np.array(modes["flattened|" + args.attn[0]]["train_loss"])
            lines += [
                "",
                f"Loss curve, flattened vs padded (same examples per step): max |diff| {np.abs(a - b).max():.4f}, "
                f"mean |diff| {np.abs(a - b).mean():.4f} over {len(a)} steps.",
            ]
        if (out_of_memory or {}).get(dist):
            lines += ["", f"Out of memory (runs left out): {', '.join(out_of_memory[dist])}."]
        lines.append("")
    return "\n".join(lines)


ORACLES = ("uniform", "uniform_work")


def label(key: str) -> str:  # "mode|attn" -> "mode (attn)": a bare | would split a markdown cell
    mode, attn = key.split("|")
    return f"{mode} ({attn})"


def oracle_table(modes: dict) -> list[str]:
    """Each packed run against every oracle run of the distribution: tokens/s and model FLOPs/s.

    The oracles (rows of the mean length; rows of the same-work length) run under sdpa and,
    with --oracle-attn, under the packed kernel too: the table shows all, where the main table
    picks one. FLOPs/s counts each example's own attention, so it credits packed rows for the
    attention work the mean-length oracle does not do.
    """
    oracles = [k for k in modes if k.split("|")[0] in ORACLES]
    packed = [k for k in modes if k.split("|")[0] not in ORACLES and not k.startswith("padded")]
    if not oracles or not packed:
        return []
    lines = [
        "",
        "Packed against each oracle (tokens/s ratio; model FLOPs/s ratio):",
        "",
        "| packed | " + " | ".join(f"vs {label(k)}" for k in oracles) + " |",
        "|---" * (len(oracles) + 1) + "|",
    ]
    for key in packed:
        run = modes[key]
        cells = [
            f"{run['real_tokens_per_s'] / modes[o]['real_tokens_per_s']:.1%}; "
            f"{run['achieved_tflops'] / modes[o]['achieved_tflops']:.1%}"
            for o in oracles
        ]
        lines.append(f"| {label(key)} | " + " | ".join(cells) + " |")
    return lines


def save(results: dict, out_of_memory: dict, args) -> None:
    data = {
        "card": card_name(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
        "out_of_memory": out_of_memory,
    }
    (args.out / "results.json").write_text(json.dumps(data, indent=1))
