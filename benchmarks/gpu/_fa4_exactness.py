"""``exactness.py fa4``: FA4's losses against padded sdpa on Llama, Qwen2 and
Mistral, the probe's verdicts, FA4's compiles per training step and the probe's cost; see exactness.py."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from packing_collators import (
    FlatteningCollator,
    MultipackBatchSampler,
    PrePackedCollator,
    check_packing_support,
    pack_lengths,
    probe_packing,
    register_varlen_attention,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import (  # noqa: E402
    CompileCounter,
    build_model,
    command,
    lengths_of,
    machine,
    markov_tokens,
    model_config,
    padded_batch,
    to_device,
    train_step,
    write_results,
)


def small_model(arch: str, attn: str, dtype, device, vocab: int, seed: int = 0):
    from transformers import AutoModelForCausalLM

    window = {"sliding_window": 128} if arch == "mistral" else {}
    config = model_config((512, 4, 8, 4, 1024), vocab, arch=arch, max_position_embeddings=4096, **window)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config._attn_implementation = attn
    return model.eval()


def token_loss(model, batches, device) -> float:
    """sum of every target token's cross-entropy (fp32) / number of targets, over all batches."""
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            batch = to_device(batch, device)
            labels = batch.pop("labels")
            logits = model(**batch).logits.float()
            shift = labels[..., 1:].reshape(-1)
            flat = logits[..., :-1, :].reshape(-1, logits.shape[-1])
            keep = shift != -100
            total += float(torch.nn.functional.cross_entropy(flat[keep], shift[keep], reduction="sum"))
            count += int(keep.sum())
    return total / count


def loss_equality(args, device, counter) -> list[dict]:
    varlen = register_varlen_attention()
    lengths = lengths_of("sft", args.examples, seed=1, high=args.max_length)
    tokens = markov_tokens(lengths, args.vocab, seed=2)
    examples = [{"input_ids": t.tolist()} for t in tokens]
    groups = [examples[i : i + 8] for i in range(0, len(examples), 8)]
    rows = []
    for row in pack_lengths(lengths, args.max_length).rows:
        rows.append(
            {
                "input_ids": np.concatenate([tokens[i] for i in row]).tolist(),
                "seq_lengths": [int(lengths[i]) for i in row],
            }
        )
    sampler = MultipackBatchSampler(lengths, args.budget, shuffle=False)
    batches = {
        "padded": [padded_batch(g) for g in groups],
        "flattened": [FlatteningCollator()(g) for g in groups],
        "prepacked": [PrePackedCollator()(rows[i : i + 2]) for i in range(0, len(rows), 2)],
        "sampler": [FlatteningCollator()([examples[i] for i in b]) for b in sampler],
    }
    results = []
    for arch in args.archs.split(","):
        ref32 = token_loss(small_model(arch, "sdpa", torch.float32, device, args.vocab), batches["padded"], device)
        row = {"arch": arch, "padded_sdpa_fp32": ref32}
        row["padded_sdpa_bf16"] = token_loss(
            small_model(arch, "sdpa", torch.bfloat16, device, args.vocab), batches["padded"], device
        )
        before = counter.snapshot()
        fa4 = small_model(arch, args.attn, torch.bfloat16, device, args.vocab)
        for name in ("flattened", "prepacked", "sampler"):
            row[f"{name}_fa4_bf16"] = token_loss(fa4, batches[name], device)
        row["flattened_varlen_bf16"] = token_loss(
            small_model(arch, varlen, torch.bfloat16, device, args.vocab), batches["flattened"], device
        )
        row["fa4_compiles"] = counter.snapshot()[0] - before[0]
        bf16_gap = abs(row["padded_sdpa_bf16"] - ref32)
        row["bf16_vs_fp32_gap"] = bf16_gap
        row["max_fa4_diff_vs_padded_bf16"] = max(
            abs(row[f"{n}_fa4_bf16"] - row["padded_sdpa_bf16"]) for n in ("flattened", "prepacked", "sampler")
        )
        row["max_fa4_diff_vs_fp32"] = max(
            abs(row[f"{n}_fa4_bf16"] - ref32) for n in ("flattened", "prepacked", "sampler")
        )
        row["varlen_diff_vs_padded_bf16"] = abs(row["flattened_varlen_bf16"] - row["padded_sdpa_bf16"])
        results.append(row)
        print(json.dumps(row), flush=True)
    return results


def probes(args, device) -> dict:
    out = {}
    for arch in args.archs.split(","):
        model = small_model(arch, args.attn, torch.bfloat16, device, args.vocab)
        flat = probe_packing(model, FlatteningCollator())
        try:  # packing_fa4 (like packing_varlen) raises on a batch without cu_seq_lens instead of running it
            pad = probe_packing(model, PrePackedCollator(mode="pad", max_length=32))
        except ValueError as error:
            pad = SimpleNamespace(summary=lambda error=error: f"the forward itself refused: {error}", passed=False)
        try:
            check_packing_support(model, collator=PrePackedCollator(mode="pad", max_length=32))
            refused = None
        except ValueError as error:
            refused = str(error)
        out[arch] = {
            "flattening_fa4": flat.summary(),
            "flattening_passed": flat.passed,
            "prepacked_pad_fa4": pad.summary(),
            "prepacked_pad_passed": pad.passed,
            "pad_refusal": refused,
        }
        print(json.dumps(out[arch]), flush=True)
    return out


def training_compiles_and_probe_cost(args, device, counter) -> dict:
    """A 200M model trained on sampler batches with FA4: compiles per step, and the probe against a step."""
    model_args = argparse.Namespace(size="200m", vocab=args.vocab, max_length=2048, seed=0)
    model = build_model(model_args, args.attn, device, torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    lengths = lengths_of("sft", 4000, seed=3)
    tokens = markov_tokens(lengths, args.vocab, seed=4)
    sampler = MultipackBatchSampler(lengths, 16384, seed=0)
    collate = FlatteningCollator()
    per_step, step_times = [], []
    for step, indices in enumerate(sampler):
        if step == args.train_steps:
            break
        batch = to_device(collate([{"input_ids": tokens[i].tolist()} for i in indices]), device)
        before = counter.snapshot()[0]
        step_times.append(train_step(model, optimizer, batch))
        per_step.append(
            {"step": step, "max_length_q": int(batch["max_length_q"]), "compiles": counter.snapshot()[0] - before}
        )
    cold = probe_packing(model, collate)
    warm = [probe_packing(model, collate).seconds for _ in range(3)]
    step = float(np.median(step_times[3:]))
    result = {
        "compiles_per_step": per_step,
        "compiles_first_step": per_step[0]["compiles"],
        "compiles_after_first_step": sum(p["compiles"] for p in per_step[1:]),
        "median_step_seconds": step,
        "first_step_seconds": step_times[0],
        "probe_vs_first_step": cold.seconds / step_times[0],
        "probe_seconds_first": cold.seconds,
        "probe_seconds_warm_median": float(np.median(warm)),
        "probe_vs_step": float(np.median(warm)) / step,
        "probe_report": cold.summary(),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "compiles_per_step"}), flush=True)
    return result


def run_fa4(args) -> None:
    """The FA4 checks: fa4_check.json and .md in --out."""
    from packing_collators import choose_attention, register_fa4_attention

    register_fa4_attention()

    device = torch.device("cuda")
    counter = CompileCounter()
    started = time.perf_counter()
    results = {
        "machine": machine(),
        "command": command(),
        "loss_equality": loss_equality(args, device, counter),
        "probes": probes(args, device),
        "training": training_compiles_and_probe_cost(args, device, counter),
        "fa4_compiles_total": counter.count,
        # what PackingTrainer's default (attn_implementation="auto") picks for an sdpa model here
        "auto_choice": choose_attention(small_model("llama", "sdpa", torch.bfloat16, device, args.vocab)),
        "fa4_compile_seconds_total": counter.seconds,
    }
    results["seconds"] = time.perf_counter() - started
    lines = [
        f"# FA4 check ({results['machine']})",
        "",
        f"`{results['command']}`",
        "",
        "| arch | padded fp32 | padded bf16 | flattened FA4 | prepacked FA4 | sampler FA4 | flattened varlen | "
        "bf16 vs fp32 gap | max FA4 diff vs padded bf16 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["loss_equality"]:
        lines.append(
            f"| {r['arch']} | {r['padded_sdpa_fp32']:.5f} | {r['padded_sdpa_bf16']:.5f} | {r['flattened_fa4_bf16']:.5f} | "
            f"{r['prepacked_fa4_bf16']:.5f} | {r['sampler_fa4_bf16']:.5f} | {r['flattened_varlen_bf16']:.5f} | "
            f"{r['bf16_vs_fp32_gap']:.5f} | {r['max_fa4_diff_vs_padded_bf16']:.5f} |"
        )
    lines += ["", "## Probe", ""] + [
        f"- {arch}: {p['flattening_fa4']}; PrePackedCollator(mode='pad'): {p['prepacked_pad_fa4']}"
        for arch, p in results["probes"].items()
    ]
    t = results["training"]
    lines += [
        "",
        "## Compiles and probe cost (200M, sampler batches of 16,384 tokens)",
        "",
        f"- FA4 compiles: {t['compiles_first_step']} in the first step, {t['compiles_after_first_step']} in the "
        f"{len(t['compiles_per_step']) - 1} steps after it; {counter.count} in the whole run ({counter.seconds:.1f} s)",
        f"- probe: {t['probe_seconds_first'] * 1e3:.1f} ms first, {t['probe_seconds_warm_median'] * 1e3:.1f} ms warm; "
        f"one training step {t['median_step_seconds'] * 1e3:.1f} ms (the first, compiling FA4: {t['first_step_seconds']:.2f} s): "
        f"warm probe = {t['probe_vs_step']:.2%} of a step, once per run",
    ]
    print("\n".join(lines))
    write_results("fa4_check", "\n".join(lines) + "\n", results, args.out)
