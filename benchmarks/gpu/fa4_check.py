"""FlashAttention-4 on a Hopper/Blackwell GPU: packed loss = padded loss, the probe's verdicts, compiles, probe cost.

For each architecture (Llama, Qwen2, Mistral with a sliding window shorter than the
longest examples), a small bf16 model (hidden 512, 4 layers, head_dim 64, GQA 2) on
the same examples (``sft`` lengths clipped to --max-length):

    padded      sdpa, batches of 8 with an attention_mask (the reference), in bf16 and fp32
    flattened   FlatteningCollator, same batches, flash_attention_4 or --attn packing_fa4 (and packing_varlen)
    prepacked   pack_lengths (bfd) rows of --max-length, PrePackedCollator(mode="flatten"), FA4
    sampler     MultipackBatchSampler batches of --budget tokens, FlatteningCollator, FA4

The loss is token-weighted over all examples (sum of target-token cross-entropies in fp32 /
their count), so every batching gives the same number up to kernel rounding; the bf16-vs-fp32
gap of the padded reference is the scale to compare against. Then: the live probe
(check_packing_support) on FlatteningCollator + FA4 (must pass) and PrePackedCollator(mode="pad")
+ FA4 (must be refused: several rows and no cu_seq_lens), the number of FA4 kernel compiles
(cutlass.cute.compile calls) in the first and in later training steps, and the probe's cost on
the 200M model against one 16k-token training step.

Usage (GPU with FA4 installed, see ../shared/GPU.md):
    python benchmarks/gpu/fa4_check.py --out benchmarks/results/fa4_check
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import packing_collators  # noqa: F401  (before flash_attn.cute, whose import can change the import path)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import (  # noqa: E402
    CompileCounter,
    build_model,
    command,
    lengths_of,
    machine,
    markov_tokens,
    padded_batch,
    to_device,
    train_step,
)

ARCHS = ("llama", "qwen2", "mistral")


def small_model(arch: str, attn: str, dtype, device, vocab: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common = dict(
        vocab_size=vocab,
        hidden_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1024,
        max_position_embeddings=4096,
        use_cache=False,
        tie_word_embeddings=False,
    )
    config = {
        "llama": LlamaConfig(**common),
        "qwen2": Qwen2Config(**common),
        "mistral": MistralConfig(**common, sliding_window=128),
    }[arch]
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config._attn_implementation = attn
    return model.eval()


def token_loss(model, batches, device) -> float:
    """sum of every target token's cross-entropy (fp32) / number of targets, over all batches."""
    import torch

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
    import torch

    from packing_collators import (
        FlatteningCollator,
        MultipackBatchSampler,
        PrePackedCollator,
        pack_lengths,
        register_varlen_attention,
    )

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
    import torch

    from packing_collators import FlatteningCollator, PrePackedCollator, check_packing_support, probe_packing

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
    import torch

    from packing_collators import FlatteningCollator, MultipackBatchSampler, probe_packing

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=4096, help="the sampler's tokens per batch")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--train-steps", type=int, default=12)
    parser.add_argument(
        "--attn", default="flash_attention_4", help="the FA4 path: transformers' flash_attention_4 or packing_fa4"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    from packing_collators.trainer import choose_attention, register_fa4_attention

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
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fa4_check.json").write_text(json.dumps(results, indent=2))
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
    (args.out / "fa4_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
