"""scale_8b.py's report.md from results.json (``_scale_8b_results.build``): the rows as a table, the scaling at each
local batch (each machine's where the runs came from several, its rows and lines marked ``[<folder>]``), the loss
checks and the 2-GPU diagnosis."""

from __future__ import annotations

import itertools


def fmt(value, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(results: dict) -> str:
    lines = [
        f"Llama-3.1-8B shape, random weights, bf16, 8,192-token rows, full activation checkpointing, FSDP2; "
        f"{results.get('card') or '?'}. MFU: {results['flops_counting']}.",
        "",
        "| setting | GPUs | ours tokens/s/GPU | torchtitan tokens/s/GPU | ours / torchtitan | ours MFU (causal docs) | "
        "torchtitan MFU (causal docs) | peak GiB/GPU: ours allocated / reserved (torchtitan reserved) | compared |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results["rows"]:
        pct = lambda a, b: "-" if a is None else f"{a:.1%}" + ("" if b is None else f" ({b:.1%})")  # noqa: E731
        lines.append(
            f"| {r['setting']}{f' [{m}]' if (m := r.get('machine')) else ''} | {r['gpus']} | {fmt(r['tokens_per_s_per_gpu'])} | "
            f"{fmt(r['torchtitan_tokens_per_s_per_gpu'])} | {fmt(r['ours_vs_torchtitan'], '.2f')} | "
            f"{pct(r['mfu'], r['mfu_causal_documents'])} | {pct(r['torchtitan_mfu'], r['torchtitan_mfu_causal_documents'])} | "
            f"{fmt(r['peak_allocated_gib_per_gpu'], '.1f')} / {fmt(r['peak_reserved_gib_per_gpu'], '.1f')} "
            f"({fmt(r['torchtitan_peak_reserved_gib'], '.1f')}) | "
            f"{r['comparison']} |"
        )
    lines.append("")
    machines = {"": results, **{f" [{m}]": scalings for m, scalings in (results.get("machines") or {}).items()}}
    for (machine, scalings), (key, label) in itertools.product(machines.items(), (
            ("scaling", "1"), ("scaling_local_batch_2", "2"), ("scaling_local_batch_4", "4"),
            ("scaling_local_batch_2_compiled", "2, compiled"))):  # fmt: skip
        scaling = scalings.get(key)
        if not scaling or not scaling["runs"]:
            continue
        same, after = scaling.get("same_steps_efficiency", {}), scaling.get("same_steps_after_warm_up_efficiency", {})
        lines.append(f"Per-GPU scaling{machine}, local batch {label} (tokens/s per GPU; efficiency against "
                     f"{scaling['base'] or '-'}, over each run's timed steps / over the same steps / over those of "
                     f"them after the run's own warm-up): "
                     + ", ".join(f"{n} on {r['gpus']} GPU(s) {fmt(r['tokens_per_s_per_gpu'])} "
                                 f"({scaling['per_gpu_efficiency'][n]:.3f} / {fmt(same.get(n), '.3f')} / "
                                 f"{fmt(after.get(n), '.3f')})"
                                 for n, r in scaling["runs"].items())
                     + f"; the 1-GPU run: {scaling['one_gpu']}.")  # fmt: skip
    for name, check in results["loss_vs_replay"].items():
        if check:
            lines.append(
                f"Losses of {check.get('reference', 'ours_4')} against its replay {check.get('replay', name)}: "
                f"{check['steps_compared']} "
                f"steps, max difference "
                f"{check['max_abs']:.4f} ({check['max_relative']:.2%} relative; "
                f"{'within' if check['within_bf16_noise'] else 'NOT within'} {check['tolerance']:.0%})."
            )
    lines += _two_gpus_lines(results.get("two_gpus_local_batch_2"))
    check = (results["runs"].get("titan030_import") or {}).get("output", "").strip().splitlines()
    if check:
        lines.append(f"torchtitan 0.3.0 on this image: {check[-1][:300]}")
    states = ", ".join(f"{n} {r.get('status')}" for n, r in results["runs"].items() if n != "commit")
    lines.append(f"Commit: {results['runs'].get('commit', {}).get('output') or 'not recorded'}.")
    lines += [f"Runs: {states}. Eight GPUs: {results['eight_gpus']}.", ""]
    return "\n".join(lines)


def _split(profile: dict | None) -> str:
    if not profile:
        return "not profiled"
    return (f"step {profile['step_ms']:,.0f} ms: compute {profile['compute_ms']:,.0f}, communication hidden "
            f"{profile['comm_hidden_ms']:,.0f} / exposed {profile['comm_exposed_ms']:,.0f}, idle {profile['idle_ms']:,.0f}")


def _two_gpus_lines(two: dict | None) -> list[str]:
    """The 2-GPU diagnosis as report lines (none when it did not run)."""
    if not two or not (two["runs"] or two.get("trainer_vs_loop")):
        return []
    lines = [""]
    if two["runs"]:
        bases = "; ".join(f"{n}: {_split(p)}" for n, p in two["base_profile"].items()) or "-"
        lines.append(f"Two GPUs against one, local batch 2 (the 2-rank plan; the 1-GPU replays {bases}):")
    for name, run in two["runs"].items():
        losses = run["losses"]
        lines.append(
            f"- {name} against {run['base'] or '-'} ({', '.join(f'{k} {v}' for k, v in run['options'].items())}): "
            f"{fmt(run['tokens_per_s_per_gpu'])} tokens/s/GPU, efficiency {fmt(run['per_gpu_efficiency'], '.3f')} / "
            f"{fmt(run['same_steps_efficiency'], '.3f')} (own steps / same steps); {_split(run['profile'])}"
            + (f" (exposed per rank: {' / '.join(f'{e:,.0f}' for e in run['exposed_ms_per_rank'])})"
               if run.get("exposed_ms_per_rank") else "")
            + "; losses "
            + (f"{losses['max_relative']:.2%} from the replay" if losses else "not compared")
        )
    for name, ratio in (two.get("trainer_vs_loop") or {}).items():
        lines.append(f"- PackingTrainer / our loop, tokens/s on the same GPUs ({name}): {ratio:.3f}")
    for name, ratio in (two.get("trainer_compiled_vs_eager") or {}).items():
        lines.append(f"- PackingTrainer, layers compiled / eager, on the same GPUs ({name}): {ratio:.3f}")
    for name, ratio in (two.get("trainer_same_steps_efficiency") or {}).items():
        lines.append(f"- PackingTrainer at 2 GPUs against the 1-GPU replay, same steps ({name}): {fmt(ratio, '.3f')}")
    for name, ratio in (two.get("compiled_as_vs_module") or {}).items():
        lines.append(f"- our loop, {name} / each layer compiled with the row length static, same GPUs: {ratio:.3f}")
    return lines + [""]
