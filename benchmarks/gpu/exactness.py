"""Packed training is exact on the GPU: losses and gradients against padded attention, per kernel.

Two checks, one command each (``--out`` gets the JSON and markdown):

``attention`` (formerly ``gpu/gpu_attention_check.py``): a Llama-style model (random weights,
bf16, GQA); for the same examples, the loss and every parameter's gradient of the packed batch
(FlatteningCollator) through ``packing_varlen``, ``flex_attention`` and ``sdpa`` against the
padded batch through ``sdpa``, beside the bf16 noise floor (padded sdpa bf16 vs fp32); then
forward+backward tokens/s of each on the same packed micro-batches (MultipackBatchSampler),
plus the same examples padded, alternating, median. ``--smoke``: tiny fp32 model on CPU.

``fa4`` (formerly ``gpu/fa4_check.py``; needs FA4 on Hopper/Blackwell): for Llama, Qwen2 and
Mistral (sliding window 128), a small bf16 model on the same ``sft`` examples, the token-weighted
loss of padded sdpa (bf16 and fp32: the scale to compare against), flattened, pre-packed (bfd,
``PrePackedCollator(mode="flatten")``) and sampler batches under FA4 (``--attn packing_fa4`` or
``flash_attention_4``) and flattened ``packing_varlen``; the live probe's verdicts
(FlatteningCollator + FA4 passes, ``PrePackedCollator(mode="pad")`` + FA4 refused); FA4 compiles
in the first and later training steps; the probe's cost against a 16k-token 200M step.

    python benchmarks/gpu/exactness.py attention --out benchmarks/results/gpu_attention
    python benchmarks/gpu/exactness.py attention --smoke --out /tmp/gpu_attention_smoke
    python benchmarks/gpu/exactness.py fa4 --attn packing_fa4 --out benchmarks/results/fa4_check
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

import packing_collators  # noqa: F401  (before flash_attn.cute, whose import can change the import path)
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

ARCHS = ("llama", "qwen2", "mistral")


# ----------------------------------------------------------------------------- attention: packed vs padded
def add_attention_arguments(parser) -> None:
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 model on CPU, sdpa/eager only")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4, help="grouped-query attention when < --heads")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tokens-per-step", type=int, default=16384, help="token budget of one packed micro-batch")
    parser.add_argument(
        "--examples", type=int, default=2000, help="examples drawn (sft lengths) for the timing batches"
    )
    parser.add_argument("--steps", type=int, default=10, help="timed micro-batches per implementation and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats (median reported)")
    parser.add_argument("--check-examples", type=int, default=8, help="examples in the correctness batch")
    parser.add_argument("--seed", type=int, default=0)


def llama_model(args, device, dtype):
    from transformers import AutoModelForCausalLM

    dims = (args.hidden, args.layers, args.heads, args.kv_heads, int(args.hidden * 2.75) // 64 * 64 or 64)
    config = model_config(dims, args.vocab, max_position_embeddings=4096)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.to(device).train()


def padded(examples, device) -> dict:
    """Right-padded to the longest example (no rounding), labels -100 on pads, on ``device``."""
    return to_device(padded_batch(examples, multiple=1), device)


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def compare(result, reference) -> dict:
    (loss, grads), (ref_loss, ref_grads) = result, reference
    diff = sum(float((grads[n] - ref_grads[n]).pow(2).sum()) for n in ref_grads) ** 0.5
    norm = sum(float(g.pow(2).sum()) for g in ref_grads.values()) ** 0.5
    per_param = [float((grads[n] - ref_grads[n]).norm() / ref_grads[n].norm().clamp_min(1e-12)) for n in ref_grads]
    return {
        "loss": loss,
        "loss_rel_diff": abs(loss - ref_loss) / abs(ref_loss),
        "grad_rel_err_global": diff / norm,
        "grad_rel_err_max_param": max(per_param),
        "grad_rel_err_median_param": statistics.median(per_param),
    }


def correctness(args, device, dtype, implementations) -> dict:
    rng = np.random.default_rng(args.seed)
    lengths = lengths_of("sft", args.check_examples, rng, high=2048 if device.type == "cuda" else 96)
    examples = [{"input_ids": rng.integers(1, args.vocab, n).tolist()} for n in lengths]
    reference_model = llama_model(args, device, torch.float32)
    fp32 = loss_and_grads(reference_model, padded(examples, device))
    # The same weights in `dtype` (initialising in bf16 directly would draw other weights and
    # make the "noise floor" the gap between two different models).
    model = reference_model.to(dtype)
    model.zero_grad(set_to_none=True)
    model.set_attn_implementation("sdpa")
    reference = loss_and_grads(model, padded(examples, device))
    out = {
        "lengths": lengths.tolist(),
        "padded_sdpa": {"loss": reference[0]},
        "noise_floor_vs_fp32": compare(reference, fp32),
    }
    packed = to_device(FlatteningCollator()(examples), device)
    floor = out["noise_floor_vs_fp32"]
    for name in implementations:
        model.set_attn_implementation(name)
        try:
            row = compare(loss_and_grads(model, packed), reference)
        except Exception as error:  # report, keep checking the others
            out[f"packed_{name}"] = {"error": f"{type(error).__name__}: {error}"}
            continue
        # Within the dtype's tolerance: no further from padded sdpa than a few times the bf16-vs-fp32
        # gap of padded sdpa itself (and never beyond 1e-2 loss / 5e-2 gradient relative error).
        fp = dtype == torch.float32
        loss_tol = min(max(3 * floor["loss_rel_diff"], 1e-5), 1e-5 if fp else 1e-2)
        grad_tol = min(max(3 * floor["grad_rel_err_global"], 1e-4), 1e-4 if fp else 5e-2)
        row["within_tolerance"] = bool(row["loss_rel_diff"] <= loss_tol and row["grad_rel_err_global"] <= grad_tol)
        out[f"packed_{name}"] = row
    model.set_attn_implementation("sdpa")
    return out


def timing(args, device, dtype, implementations) -> dict:
    rng = np.random.default_rng(args.seed + 1)
    lengths = lengths_of("sft", args.examples, rng, high=min(2048, args.tokens_per_step))
    sampler = MultipackBatchSampler(lengths, args.tokens_per_step, seed=args.seed, num_replicas=1, rank=0)
    plan = list(sampler)[: args.steps + 2]  # 2 warm-up batches, then the timed ones
    examples = [rng.integers(1, args.vocab, n).tolist() for n in lengths]
    collate = FlatteningCollator()
    packed = [to_device(collate([{"input_ids": examples[i]} for i in idx]), device) for idx in plan]
    padded_batches = [padded([{"input_ids": examples[i]} for i in idx], device) for idx in plan]
    tokens = [int(sum(lengths[i] for i in idx)) for idx in plan]
    model = llama_model(args, device, dtype)
    runs = {name: [] for name in implementations}
    runs["padded_sdpa"] = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run(name):
        batches = padded_batches if name == "padded_sdpa" else packed
        model.set_attn_implementation("sdpa" if name == "padded_sdpa" else name)
        for batch in batches[:2]:  # warm-up (flex compiles here)
            model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
        for batch in batches[2:]:
            model(**batch).loss.backward()
        sync()
        model.zero_grad(set_to_none=True)
        return sum(tokens[2:]) / (time.perf_counter() - start)

    errors = {}
    padded_tokens = max(len(idx) * int(max(lengths[i] for i in idx)) for idx in plan)
    if padded_tokens > 4 * args.tokens_per_step:  # would likely run out of memory; say so instead
        errors["padded_sdpa"] = f"skipped: a padded batch would hold {padded_tokens} tokens (> 4x the budget)"
    for _ in range(args.repeats):  # alternate the implementations, repeat, take the median
        for name in runs:
            if name in errors:
                continue
            try:
                runs[name].append(run(name))
            except Exception as error:
                errors[name] = f"{type(error).__name__}: {error}"
                model.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return {
        "micro_batches_timed": len(plan) - 2,
        "tokens_per_micro_batch_mean": float(np.mean(tokens[2:])),
        "examples_per_micro_batch_mean": float(np.mean([len(p) for p in plan[2:]])),
        "tokens_per_s_median": {n: statistics.median(v) for n, v in runs.items() if v},
        "tokens_per_s_all": runs,
        "errors": errors,
    }


def markdown(report: dict) -> str:
    lines = [
        f"# Packed attention check on {report['device']}",
        "",
        f"`{report['command']}`  ",
        f"torch {report['torch']}, transformers {report['transformers']}, dtype {report['dtype']}, model {report['model']}",
        "",
        "## Loss and gradients vs padded sdpa (same examples)",
        "",
        "| path | loss | loss rel diff | grad rel err (global) | grad rel err (max param) | within tolerance |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["correctness"].items():
        if name in ("lengths", "padded_sdpa"):
            continue
        if "error" in row:
            lines.append(f"| {name} | error: {row['error'][:120]} | | | | no |")
        else:
            lines.append(
                f"| {name} | {row['loss']:.6f} | {row['loss_rel_diff']:.2e} | {row['grad_rel_err_global']:.2e} | "
                f"{row['grad_rel_err_max_param']:.2e} | {row.get('within_tolerance', '(reference gap)')} |"
            )
    lines.append(
        f"\npadded sdpa loss: {report['correctness']['padded_sdpa']['loss']:.6f}; "
        "`noise_floor_vs_fp32` is padded sdpa in this dtype vs fp32 (the tolerance to judge by)."
    )
    t = report["timing"]
    lines += [
        "",
        f"## Forward+backward tokens/s ({t['micro_batches_timed']} micro-batches, mean {t['tokens_per_micro_batch_mean']:.0f} "
        f"real tokens / {t['examples_per_micro_batch_mean']:.1f} examples each, median of repeats)",
        "",
        "| path | tokens/s |",
        "|---|---|",
    ]
    for name, value in sorted(t["tokens_per_s_median"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {value:,.0f} |")
    for name, error in t["errors"].items():
        lines.append(f"| {name} | error: {error[:120]} |")
    return "\n".join(lines) + "\n"


def run_attention(args) -> int:
    """The packed attention paths against padded sdpa (formerly gpu/gpu_attention_check.py)."""
    import transformers

    if args.smoke:
        device, dtype, implementations = torch.device("cpu"), torch.float32, ["sdpa", "eager"]
    else:
        if not torch.cuda.is_available():
            print("No CUDA device: run with --smoke on CPU, or on a GPU machine.", file=sys.stderr)
            return 2
        device, dtype = torch.device("cuda"), torch.bfloat16
        implementations = [register_varlen_attention(), "flex_attention", "sdpa"]
    card = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()})"
    )
    print(f"device: {card}")
    report = {
        "device": card,
        "command": command(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(dtype).replace("torch.", ""),
        "model": f"Llama-style {args.layers} layers, hidden {args.hidden}, {args.heads} heads / {args.kv_heads} kv heads",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    report["correctness"] = correctness(args, device, dtype, implementations)
    report["timing"] = timing(args, device, dtype, implementations)
    print(markdown(report))
    write_results("gpu_attention", markdown(report), report, args.out)
    return 0


# ----------------------------------------------------------------------------- fa4: FlashAttention-4
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
    """The FA4 checks (formerly gpu/fa4_check.py): fa4_check.json and .md in --out."""
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    checks = parser.add_subparsers(dest="check", required=True)
    attention = checks.add_parser("attention", help="packed vs padded losses, gradients and tokens/s per kernel")
    add_attention_arguments(attention)
    fa4 = checks.add_parser("fa4", help="FA4: loss equality on 3 architectures, probe verdicts, compiles, probe cost")
    fa4.add_argument("--archs", default=",".join(ARCHS))
    fa4.add_argument("--examples", type=int, default=64)
    fa4.add_argument("--max-length", type=int, default=1024)
    fa4.add_argument("--budget", type=int, default=4096, help="the sampler's tokens per batch")
    fa4.add_argument("--vocab", type=int, default=32000)
    fa4.add_argument("--train-steps", type=int, default=12)
    fa4.add_argument(
        "--attn", default="flash_attention_4", help="the FA4 path: transformers' flash_attention_4 or packing_fa4"
    )

    for sub, default in ((attention, "benchmarks/results/gpu_attention"), (fa4, None)):
        sub.add_argument("--out", type=Path, default=default and Path(default), required=default is None)
    args = parser.parse_args(argv)
    if args.check == "fa4":
        return run_fa4(args) or 0
    if args.smoke:
        args.layers, args.hidden, args.heads, args.kv_heads, args.vocab = 2, 64, 4, 2, 256
        args.tokens_per_step, args.examples, args.steps, args.repeats, args.check_examples = 512, 64, 2, 2, 4
    return run_attention(args)


if __name__ == "__main__":
    sys.exit(main())
