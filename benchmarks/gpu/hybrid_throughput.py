"""Hybrid models packed on a GPU: exact against each example alone, and fast against the no-padding oracle.

    python benchmarks/gpu/hybrid_throughput.py --model qwen3_5 --out benchmarks/results/hybrid_h200
    python benchmarks/gpu/hybrid_throughput.py --model nemotron_h --out benchmarks/results/hybrid_h200
    python benchmarks/gpu/hybrid_throughput.py --model qwen3_5 --smoke --out /tmp/hybrid_smoke   (CPU, tiny)

Two parts, one model per run (results merge into ``<out>/results.json``):

- exactness, bf16: a few examples packed in one row (``enable_packing`` + ``FlatteningCollator``)
  against each example run alone; beside it the same examples in one right-padded batch with an
  attention mask (the same computation in another layout: bf16's own noise for this model) and
  the float32 model (bf16's distance from exact).
- throughput: real tokens/s of a forward + backward (no optimizer step, so the packing differences are
  not diluted), 3 alternating rounds, median, for ``--tokens-per-step`` token rows of the
  distribution's examples packed (``packed``), the same rows with the stateful layers forced onto
  the per-example path (``per_example``, the fallback's cost), rows of examples all of the mean
  length (``oracle``: no padding, the same kernels), rows of examples all of the work length
  sum(l^2) / sum(l) (``oracle_work``: the data's attention work per token, nothing uneven), and padded
  batches of 8 examples in random order under sdpa (``padded``, what a user gets without packing). Each
  round's per-step GPU milliseconds are kept (``rounds_steps_ms``).

Models (random weights, bf16): ``qwen3_5``, a Qwen3.5-0.8B shape (hidden 1024, 24 layers, 3 Gated
DeltaNet : 1 attention, vocab 248,320); ``nemotron_h``, a Nemotron-H-like ~1B shape (hidden 1536,
24 layers: Mamba2 / MLP pairs, one attention layer in four). Attention layers run ``--attn``
(``packing_varlen``: PyTorch's Flash varlen kernel) on packed rows. Writes per model and distribution
``packed_vs_oracle``, ``packed_vs_padded``, ``max_logit_diff_vs_alone`` and the path of each layer kind.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
from pathlib import Path

import numpy as np
import torch

from packing_collators import FlatteningCollator, enable_packing, register_varlen_attention
from packing_collators.models import packing_layers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _model_runs import alternate_modes, gaps, kernel_versions, set_attention, write_merged  # noqa: E402
from _shared import command, lengths_of, markov_tokens, padded_batch, to_device  # noqa: E402

DISTRIBUTIONS = ("sft", "flan_like", "orcamath_like")


def qwen3_5_config(smoke: bool):
    from transformers import Qwen3_5TextConfig

    layer_types = ["linear_attention"] * 3 + ["full_attention"]
    if smoke:
        sizes = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     intermediate_size=128, linear_num_key_heads=2, linear_num_value_heads=4,
                     linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=512)  # fmt: skip
        return Qwen3_5TextConfig(**sizes, layer_types=layer_types, use_cache=False)
    return Qwen3_5TextConfig(  # Qwen3.5-0.8B's text model
        vocab_size=248320, hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
        head_dim=256, intermediate_size=3584, linear_num_key_heads=16, linear_num_value_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=layer_types * 6,
        tie_word_embeddings=True, use_cache=False, max_position_embeddings=32768,
    )  # fmt: skip


def nemotron_h_config(smoke: bool):
    from transformers import NemotronHConfig

    pattern = ["linear_attention", "mlp"] * 3 + ["full_attention", "mlp"]  # Mamba2, MLP, ..., attention, MLP
    if smoke:
        sizes = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                     mamba_num_heads=8, mamba_head_dim=16, n_groups=1, ssm_state_size=16, vocab_size=512)  # fmt: skip
        return NemotronHConfig(**sizes, layers_block_type=pattern, use_cache=False)
    return NemotronHConfig(
        vocab_size=131072, hidden_size=1536, layers_block_type=pattern * 3, num_attention_heads=12,
        num_key_value_heads=4, head_dim=128, intermediate_size=6144, mamba_num_heads=48, mamba_head_dim=64,
        n_groups=8, ssm_state_size=128, conv_kernel=4, expand=2, use_cache=False, max_position_embeddings=32768,
    )  # fmt: skip


CONFIGS = {"qwen3_5": qwen3_5_config, "nemotron_h": nemotron_h_config}


def build(args, device, dtype):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(CONFIGS[args.model](args.smoke)).to(dtype)
    return model.train()


# ----------------------------------------------------------------------------- exactness
def exactness(args, model, device) -> dict:
    """max |logit diff| of the examples packed vs alone, in bf16 and in float32, with bf16's own noise beside it.

    bf16 noise: the same examples in one right-padded batch vs alone (another layout, the same math), and
    each bf16 run against the float32 model run alone (the distance from exact of any bf16 run).
    """
    lengths = lengths_of("sft", args.check_examples, seed=1)
    examples = [{"input_ids": t.tolist()} for t in markov_tokens(lengths, model.config.vocab_size, seed=1)]
    batch = FlatteningCollator()(examples)
    batch.pop("labels")
    padded = padded_batch(examples, multiple=1)
    model.eval()
    runs = {}
    with torch.no_grad():
        for precision in ("float32", "bfloat16") if device.type == "cuda" else ("float32",):
            model.to(getattr(torch, precision))
            # packing_varlen needs a half dtype: float32 runs the packed row under sdpa (the packed mask)
            set_attention(model, args.attn if precision == "bfloat16" else "sdpa")
            runs[f"packed_{precision}"] = model(**to_device(batch, device)).logits[0].float()
            set_attention(model, "sdpa")
            runs[f"alone_{precision}"] = torch.cat(
                [model(input_ids=torch.tensor([e["input_ids"]], device=device)).logits[0].float() for e in examples]
            )
            logits = model(**to_device({k: padded[k] for k in ("input_ids", "attention_mask")}, device)).logits
            runs[f"padded_{precision}"] = torch.cat([logits[i, :n].float() for i, n in enumerate(lengths)])
    model.train()
    low = "bfloat16" if device.type == "cuda" else "float32"
    return {"examples": [int(n) for n in lengths], **gaps(runs, low)}


# ----------------------------------------------------------------------------- throughput
def packed_rows(lengths: np.ndarray, tokens: int, vocab: int, steps: int, seed: int) -> list[dict]:
    """``steps`` one-row batches: the examples in order, each row filled up to ``tokens`` (next fit)."""
    collator, rows, row, used = FlatteningCollator(), [], [], 0
    for ids in markov_tokens(lengths, vocab, seed=seed):
        if used + len(ids) > tokens and row:
            rows.append(collator(row))
            row, used = [], 0
            if len(rows) == steps:
                break
        row.append({"input_ids": ids.tolist(), "labels": ids.tolist()})
        used += len(ids)
    if row and len(rows) < steps:  # the last row (an oracle's rows fill exactly, so none overflows into another)
        rows.append(collator(row))
    return rows


def oracle_rows(lengths: np.ndarray, tokens: int, vocab: int, steps: int) -> list[dict]:
    """Rows of examples all of the mean length: the same real tokens per step, nothing uneven."""
    mean = int(round(lengths.mean()))
    count = max(1, tokens // mean)
    same = np.full(count * steps, mean)
    return packed_rows(same, count * mean, vocab, steps, seed=2)


def oracle_work_rows(lengths: np.ndarray, tokens: int, vocab: int, steps: int) -> list[dict]:
    """Rows of examples all of the work length (sum l^2 / sum l): the data's attention work per token, nothing uneven."""
    from train_throughput import work_length

    work = work_length(lengths, tokens)
    count = max(1, tokens // work)
    return packed_rows(np.full(count * steps, work), count * work, vocab, steps, seed=4)


def padded_batches(lengths: np.ndarray, vocab: int, steps: int, size: int = 8) -> list[dict]:
    examples = [{"input_ids": t.tolist()} for t in markov_tokens(lengths, vocab, seed=3)]
    random.Random(0).shuffle(examples)
    return [padded_batch(examples[i * size : (i + 1) * size]) for i in range(steps)]


def throughput(args, model, per_example_model, device, distribution: str) -> dict:
    lengths = lengths_of(distribution, args.examples, seed=0)
    vocab, steps = model.config.vocab_size, args.steps + args.warmup
    plans = {
        "packed": (model, args.attn, packed_rows(lengths, args.tokens_per_step, vocab, steps, seed=0)),
        "per_example": (per_example_model, args.attn, packed_rows(lengths, args.tokens_per_step, vocab, steps, 0)),
        "oracle": (model, args.attn, oracle_rows(lengths, args.tokens_per_step, vocab, steps)),
        "oracle_work": (model, args.attn, oracle_work_rows(lengths, args.tokens_per_step, vocab, steps)),
        "padded": (model, "sdpa", padded_batches(lengths, vocab, steps)),
    }
    if per_example_model is None:
        del plans["per_example"]
    plans = {name: plan for name, plan in plans.items() if name in args.modes.split(",")}
    result = alternate_modes(plans, args.rounds, device, args.warmup, real_tokens, distribution)
    return {"mean_length": float(lengths.mean()), **result}


def real_tokens(batch: dict) -> int:
    """Tokens that are not padding: the mask's ones in a padded batch, every token of a packed row."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), default="qwen3_5")
    parser.add_argument("--distributions", default=",".join(DISTRIBUTIONS))
    parser.add_argument("--attn", default="packing_varlen", help="attention of the packed rows")
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per mode and round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check-examples", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny float32 model on the CPU, sdpa, 1 round")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-exactness", action="store_true")
    parser.add_argument("--modes", default="packed,per_example,oracle,padded", help="throughput modes to time")
    parser.add_argument("--name", help="key of this run in results.json (default: --model)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    if args.smoke:
        args.attn, args.rounds, args.steps, args.warmup, args.tokens_per_step = "sdpa", 1, 2, 1, 1024
    elif args.attn == "packing_varlen":
        register_varlen_attention()
    logging_paths()
    model = enable_packing(build(args, device, dtype))
    report = {
        "model": args.name or args.model,
        "command": command(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "kernels": kernel_versions(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "paths": packing_layers(model).paths,
        "exactness": None if args.skip_exactness else exactness(args, model, device),
    }
    print(json.dumps(report, indent=1))
    if not args.skip_throughput:
        per_example = per_example_model(args, model, device, dtype) if "per_example" in args.modes else None
        report["paths_per_example"] = packing_layers(per_example).paths if per_example is not None else None
        report["distributions"] = {}
        for distribution in args.distributions.split(","):
            report["distributions"][distribution] = throughput(args, model, per_example, device, distribution)
            print(json.dumps(report["distributions"][distribution], indent=1))
            write_merged(args.out, report)  # what is done survives a time-out
    write_merged(args.out, report)


def per_example_model(args, model, device, dtype):
    """A second model whose Gated DeltaNet layers are forced onto the per-example path (None: they already are)."""
    from packing_collators.models._enable import enable_packing_with

    if not any("varlen kernels on" in path for path in packing_layers(model).paths.values()):
        return None
    other = enable_packing_with(build(args, device, dtype), lambda: (None, "forced: the per-example path's cost"))
    other.load_state_dict(model.state_dict())
    return other


def logging_paths() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("packing_collators").setLevel(logging.INFO)


if __name__ == "__main__":
    main()
