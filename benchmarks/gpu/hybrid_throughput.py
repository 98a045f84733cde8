"""Hybrid models packed on a GPU: exact against each example alone, and fast against the no-padding oracle.

    python benchmarks/gpu/hybrid_throughput.py --model nemotron_h --out benchmarks/results/hybrid_kernels
    python benchmarks/gpu/hybrid_throughput.py --model lfm2 --layers 8 --out /tmp/hybrid          (fewer layers)
    python benchmarks/gpu/hybrid_throughput.py --model granitemoehybrid --smoke --out /tmp/smoke  (CPU, tiny)
    python benchmarks/gpu/hybrid_throughput.py --model lfm2 --smoke --kernels reference --out /tmp/smoke
        (CPU, tiny, the varlen paths on the tests' torch reference kernels)
    bash benchmarks/gpu/hybrid_kernels.sh          (the one-call device plan: three models, three distributions)

Two parts, one model per run (results merge into ``<out>/results.json`` under ``--name``, default ``--model``):

- exactness (``_hybrid_exactness.py``): a few examples packed in one row against each example alone,
  in bf16 beside bf16's own noise (the same examples right-padded; alone in float32) and in float32,
  logits and the gradients; and against each example alone on the same varlen kernels.
- throughput: real tokens/s of a forward + backward (no optimizer step), alternating rounds, median,
  for ``--tokens-per-step`` token rows of the distribution's examples:

      packed          the rows packed (enable_packing + FlatteningCollator; the stateful layers' paths below)
      oracle          rows of examples all of the mean length: no padding, the same kernels
      oracle_work     rows of examples all of the work length sum(l^2) / sum(l): the data's attention work
      padded          batches of 8 examples in random order, right-padded, sdpa: transformers' own layers
                      (its kernel path where it imports one: mamba-ssm / causal-conv1d for Mamba2, fla for
                      Gated DeltaNet and KDA; else its torch reference, which ``padded_path`` names)
      padded_kernels  the same padded batches on the packed path's kernels (each row's padding a segment of
                      its own): what padding costs at kernel speed
      per_example     packed rows with the stateful layers forced onto the per-example path

Writes, merged into what an earlier run of the same ``--name`` wrote: per distribution ``packed_vs_<mode>``
(``packed_vs_oracle``, ``packed_vs_padded``, ...), every round's tokens/s and per-step GPU milliseconds; per
model ``paths`` (each layer kind's path), ``padded_path``, ``exactness`` (``max_logit_diff_vs_alone`` and the
rest) and the kernel versions. Models and their shapes: ``_hybrid_models.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import sys
from pathlib import Path

import numpy as np
import torch

from packing_collators import FlatteningCollator, register_varlen_attention
from packing_collators.models import packing_layers
from packing_collators.models._enable import enable_packing_with

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/gpu/: its _hybrid_* parts (when imported)
from _hybrid_exactness import exactness  # noqa: E402
from _hybrid_models import CONFIGS  # noqa: E402
from _model_runs import alternate_modes, kernel_versions, write_merged  # noqa: E402
from _shared import command, lengths_of, markov_tokens, padded_batch  # noqa: E402

DISTRIBUTIONS = ("sft", "flan_like", "orcamath_like")
MODES = ("packed", "per_example", "oracle", "oracle_work", "padded", "padded_kernels")


def build(args, device, dtype):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(CONFIGS[args.model](args.smoke, args.layers)).to(dtype)
    return model.train()


# ----------------------------------------------------------------------------- batches
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
    return packed_rows(np.full(count * steps, mean), count * mean, vocab, steps, seed=2)


def oracle_work_rows(lengths: np.ndarray, tokens: int, vocab: int, steps: int) -> list[dict]:
    """Rows of examples all of the work length (sum l^2 / sum l): the data's attention work per token, none uneven."""
    from train_throughput import work_length

    work = work_length(lengths, tokens)
    count = max(1, tokens // work)
    return packed_rows(np.full(count * steps, work), count * work, vocab, steps, seed=4)


def padded_batches(lengths: np.ndarray, vocab: int, steps: int, size: int = 8) -> list[dict]:
    examples = [{"input_ids": t.tolist()} for t in markov_tokens(lengths, vocab, seed=3)]
    random.Random(0).shuffle(examples)
    return [padded_batch(examples[i * size : (i + 1) * size]) for i in range(steps)]


def rows_per_call(batches: list[dict], rows: int) -> list[dict]:
    """Each padded batch as calls of ``rows`` of its rows, at its width: the same padding and work, less memory."""
    return [{key: value[start : start + rows] for key, value in batch.items()}
            for batch in batches for start in range(0, len(batch["input_ids"]), rows)]  # fmt: skip


def with_padding_segments(batch: dict) -> dict:
    """A padded batch whose padding restarts the positions: each row's padding is a segment of its own, so
    enable_packing runs the whole (B, W) batch on the varlen kernels (padding included, as padding costs)."""
    mask = batch["attention_mask"].bool()
    width = mask.shape[1]
    positions = torch.arange(width).expand_as(mask)
    lengths = mask.sum(1, keepdim=True)
    return {**batch, "position_ids": torch.where(mask, positions, positions - lengths)}


def real_tokens(batch: dict) -> int:
    """Tokens that are not padding: the mask's ones in a padded batch, every token of a packed row."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()


# ----------------------------------------------------------------------------- throughput
def throughput(args, model, per_example, device, distribution: str) -> dict:
    lengths = lengths_of(distribution, args.examples, seed=0, high=512 if args.smoke else None)  # smoke: short rows
    vocab, steps, slow = model.config.vocab_size, args.steps + args.warmup, args.padded_steps + args.warmup
    modes = args.modes.split(",")
    padded = padded_batches(lengths, vocab, slow) if {"padded", "padded_kernels"} & set(modes) else []
    split = rows_per_call(padded, args.padded_rows_per_call)
    makers = {
        "packed": lambda: (model, args.attn, packed_rows(lengths, args.tokens_per_step, vocab, steps, seed=0)),
        "per_example": lambda: (per_example, args.attn, packed_rows(lengths, args.tokens_per_step, vocab, steps, 0)),
        "oracle": lambda: (model, args.attn, oracle_rows(lengths, args.tokens_per_step, vocab, steps)),
        "oracle_work": lambda: (model, args.attn, oracle_work_rows(lengths, args.tokens_per_step, vocab, steps)),
        "padded": lambda: (model, "sdpa", split),
        "padded_kernels": lambda: (model, "sdpa", [with_padding_segments(b) for b in padded]),
    }
    plans = {name: makers[name]() for name in modes if name != "per_example" or per_example is not None}
    result = alternate_modes(plans, args.rounds, device, args.warmup, real_tokens, distribution)
    return {"mean_length": float(lengths.mean()), "max_length": int(lengths.max()), **result}


def padded_path(model) -> str:
    """What transformers' own layers run in the padded mode: its kernel packages where they import, else torch."""
    from packing_collators.models import find_stateful_layers
    from packing_collators.models._varlen import varlen_layer

    have = {name: importlib.util.find_spec(name) is not None for name in ("mamba_ssm", "causal_conv1d", "fla")}
    families = {spec.family.name for _, layer in find_stateful_layers(model) if (spec := varlen_layer(layer))}
    if "Mamba2" in families:
        if have["mamba_ssm"] and have["causal_conv1d"]:
            return "transformers' Mamba2 layers on mamba-ssm's and causal-conv1d's kernels"
        return ("transformers' Mamba2 torch reference (mamba2_chunk_scan, F.conv1d): mamba-ssm and causal-conv1d "
                "are not importable here, so packed_vs_padded also holds the kernels' speed over that reference; "
                "packed_vs_padded_kernels is padding's cost alone")  # fmt: skip
    if "short convolution" in families:
        return "transformers' short conv: " + ("causal-conv1d" if have["causal_conv1d"] else "torch F.conv1d (cuDNN)")
    return "transformers' layers: " + ("fla's kernels where they take them" if have["fla"] else "torch reference")


def find_kernels(args):
    """fla's kernels, or (``--kernels reference``, for a CPU check of the varlen paths) the tests' torch references."""
    from packing_collators.models._kernels import fla_kernels

    if args.kernels == "fla":
        return fla_kernels
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "models"))
    from _varlen_reference import REFERENCE

    return lambda: (REFERENCE, "")


def per_example_model(args, model, device, dtype):
    """A second model whose stateful layers are forced onto the per-example path (None: they already are)."""
    if not any("varlen kernels on" in path for path in packing_layers(model).paths.values()):
        return None
    other = enable_packing_with(build(args, device, dtype), lambda: (None, "forced: the per-example path's cost"))
    other.load_state_dict(model.state_dict())
    return other


def _arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), default="qwen3_5")
    parser.add_argument("--layers", type=int, help="keep the first N layers of the model's pattern")
    parser.add_argument("--distributions", default=",".join(DISTRIBUTIONS))
    parser.add_argument("--attn", default="packing_varlen", help="attention of the packed rows")
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per mode and round")
    parser.add_argument("--padded-steps", type=int, help="timed steps of the padded modes (default: --steps)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--padded-rows-per-call", type=int, default=8,
                        help="padded mode: each batch of 8 run as calls of this many of its rows (the same width, "
                             "padding and work, in less memory: transformers' Mamba2 torch reference holds rows x "
                             "width x chunk x heads x state floats at once); padded_kernels runs the whole batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check-examples", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny float32 model on the CPU, sdpa, 1 round")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-exactness", action="store_true")
    parser.add_argument("--modes", default="packed,oracle,oracle_work,padded,padded_kernels", help=", ".join(MODES))
    parser.add_argument("--kernels", choices=("fla", "reference"), default="fla",
                        help="reference: the tests' per-example torch kernels on the CPU (with --smoke)")
    parser.add_argument("--name", help="key of this run in results.json (default: --model)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"--modes {sorted(unknown)}: not among {', '.join(MODES)}")
    if args.padded_rows_per_call < 1:
        parser.error(f"--padded-rows-per-call {args.padded_rows_per_call}: give at least 1 row a call")
    if args.smoke:
        args.attn, args.rounds, args.steps, args.warmup, args.tokens_per_step = "sdpa", 1, 2, 1, 1024
        args.examples, args.padded_steps = min(args.examples, 400), 1
    args.padded_steps = args.steps if args.padded_steps is None else args.padded_steps
    return args


def write_entry(out: Path, report: dict) -> None:
    """``report`` into ``<out>/results.json`` under its name, keeping what an earlier process of the same name wrote
    and this one did not (the GPU plan runs a model's throughput and its exactness as two processes)."""
    path = out / "results.json"
    earlier = json.loads(path.read_text()).get(report["model"], {}) if path.exists() else {}
    distributions = {**earlier.get("distributions", {}), **report.get("distributions", {})}
    write_merged(out, {**earlier, **report, **({"distributions": distributions} if distributions else {})})


def main(argv=None) -> None:
    args = _arguments(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    if args.attn == "packing_varlen":
        register_varlen_attention()
    logging_paths()
    model = enable_packing_with(build(args, device, dtype), find_kernels(args))
    report = {
        "model": args.name or args.model,
        "command": command(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "kernels": kernel_versions(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": len(model.config.layer_types),
        "paths": packing_layers(model).paths,
        "padded_path": padded_path(model),
    }
    if not args.skip_exactness:
        report["exactness"] = exactness(args, model, device)
        report["exactness_command"] = report["command"]
    print(json.dumps(report, indent=1), flush=True)
    write_entry(args.out, report)
    if not args.skip_throughput:
        per_example = per_example_model(args, model, device, dtype) if "per_example" in args.modes else None
        report["paths_per_example"] = packing_layers(per_example).paths if per_example is not None else None
        report["distributions"] = {}
        for distribution in args.distributions.split(","):
            report["distributions"][distribution] = throughput(args, model, per_example, device, distribution)
            print(json.dumps(report["distributions"][distribution], indent=1), flush=True)
            write_entry(args.out, report)  # what is done survives a time-out


def logging_paths() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("packing_collators").setLevel(logging.INFO)


if __name__ == "__main__":
    main()
