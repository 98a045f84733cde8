"""Packed training is exact on the GPU: losses and gradients against padded attention, per kernel.

    python benchmarks/gpu/exactness.py attention --out benchmarks/results/gpu_attention
    python benchmarks/gpu/exactness.py attention --smoke --out /tmp/gpu_attention_smoke
    python benchmarks/gpu/exactness.py fa4 --attn packing_fa4 --out benchmarks/results/fa4_check

What the ``attention`` and ``fa4`` checks compare: see docs/benchmarks.md#exactnesspy.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import packing_collators  # noqa: F401  (before flash_attn.cute, whose import can change the import path)
from packing_collators import (
    FlatteningCollator,
    MultipackBatchSampler,
    register_varlen_attention,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import (  # noqa: E402
    command,
    lengths_of,
    model_config,
    padded_batch,
    to_device,
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
    """The packed attention paths against padded sdpa."""
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
    if args.check == "fa4":  # its code lives in _fa4_exactness.py, beside this script
        from _fa4_exactness import run_fa4

        return run_fa4(args) or 0
    if args.smoke:
        args.layers, args.hidden, args.heads, args.kv_heads, args.vocab = 2, 64, 4, 2, 256
        args.tokens_per_step, args.examples, args.steps, args.repeats, args.check_examples = 512, 64, 2, 2, 4
    return run_attention(args)


if __name__ == "__main__":
    sys.exit(main())
