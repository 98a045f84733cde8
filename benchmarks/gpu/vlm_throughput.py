"""A vision-language model packed on a GPU: exact against each example alone, fast against padding and the oracle.

    python benchmarks/gpu/vlm_throughput.py --out benchmarks/results/vlm_h200
    python benchmarks/gpu/vlm_throughput.py --smoke --out /tmp/vlm_smoke          (CPU, tiny)

The model is a Qwen2.5-VL-3B shape with random weights in bf16 (text: hidden 2048, 36 layers, 16 heads,
2 key/value heads; vision: 32 blocks of width 1280, patches of 14, a 2x2 merge). The data mixes
image+text and text-only examples half and half: text lengths from the ``sft`` distribution (at most
``--max-text``), one image per image example with a grid drawn from ``--grids`` (each a (1, h, w) patch
grid: h*w patches through the vision tower, h*w/4 placeholder tokens in the text), synthetic pixels.

- exactness: a few examples (images of different sizes and a text-only one) packed in one row
  (``FlatteningCollator`` + ``enable_packing``) against each run alone, in bf16 and float32, beside
  bf16's own noise (the same examples right-padded in one batch; each run against float32 alone).
- throughput, 3 alternating rounds, median, real text tokens/s of a forward + backward: rows of
  ``--tokens-per-step`` text tokens (``packed``), rows of examples all of one shape (``oracle``: the
  mean text length, every other example with the median grid; no padding, the same kernels), and
  padded batches of 8 examples in random order under sdpa (``padded``).
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
from _shared import command, lengths_of, padded_batch, to_device  # noqa: E402

GRIDS = "16x16,16x24,24x32,32x32,32x48"  # patch grids: 64 to 384 placeholder tokens, 256 to 1,536 patches


def config(smoke: bool):
    from transformers import Qwen2_5_VLConfig

    if smoke:
        text = dict(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=128, rope_parameters={"rope_type": "default",
                    "rope_theta": 1e6, "mrope_section": [4, 2, 2]})  # fmt: skip
        vision = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                      patch_size=2, window_size=8, fullatt_block_indexes=[1])  # fmt: skip
    else:  # Qwen2.5-VL-3B-Instruct's shapes
        text = dict(vocab_size=151936, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                    num_key_value_heads=2, intermediate_size=11008, max_position_embeddings=32768,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})  # fmt: skip
        vision = dict(depth=32, hidden_size=1280, num_heads=16, intermediate_size=3420, out_hidden_size=2048,
                      patch_size=14, window_size=112, fullatt_block_indexes=[7, 15, 23, 31])  # fmt: skip
    made = Qwen2_5_VLConfig(text_config={**text, "use_cache": False}, vision_config=vision)
    made.use_cache = False
    if smoke:  # the special tokens inside the tiny vocabulary
        top = text["vocab_size"]
        made.image_token_id, made.video_token_id, made.vision_start_token_id, made.vision_end_token_id = (
            top - 1, top - 2, top - 3, top - 4,
        )  # fmt: skip
    return made


def build(args, device, dtype):
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(config(args.smoke)).to(dtype)
    return model.train()


def make_examples(args, cfg, count: int, seed: int, *, shape=None) -> list[dict]:
    """``count`` processor-style examples, every other one with an image (``shape``: all one (text, grid))."""
    rng = np.random.default_rng(seed)
    vision = cfg.vision_config
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    grids = [tuple(int(x) for x in g.split("x")) for g in args.grids.split(",")]
    lengths = np.minimum(lengths_of("sft", count, seed=seed), args.max_text)
    out = []
    for i in range(count):
        text = shape[0] if shape else int(lengths[i])
        ids = rng.integers(0, min(cfg.text_config.vocab_size - 8, 32000), text).tolist()
        example = {"input_ids": ids, "mm_token_type_ids": [0] * text}
        if i % 2 == 0:
            h, w = shape[1] if shape else grids[rng.integers(len(grids))]
            placeholders = h * w // vision.spatial_merge_size**2
            middle = text // 2
            tokens = [cfg.vision_start_token_id, *[cfg.image_token_id] * placeholders, cfg.vision_end_token_id]
            example["input_ids"] = ids[:middle] + tokens + ids[middle:]
            example["mm_token_type_ids"] = [0] * middle + [0, *[1] * placeholders, 0] + [0] * (text - middle)
            example["pixel_values"] = torch.from_numpy(rng.standard_normal((h * w, width), dtype=np.float32))
            example["image_grid_thw"] = torch.tensor([[1, h, w]])
        example["labels"] = [t if k == 0 else -100 for t, k in zip(example["input_ids"], example["mm_token_type_ids"])]
        out.append(example)
    return out


def packed_rows(examples: list[dict], tokens: int, steps: int) -> list[dict]:
    collator, rows, row, used = FlatteningCollator(), [], [], 0
    for example in examples:
        n = len(example["input_ids"])
        if used + n > tokens and row:
            rows.append(collator(row))
            row, used = [], 0
            if len(rows) == steps:
                break
        row.append(example)
        used += n
    return rows


def padded_batches(examples: list[dict], steps: int, size: int = 8) -> list[dict]:
    shuffled = list(examples)
    random.Random(0).shuffle(shuffled)
    out = []
    for i in range(steps):
        group = shuffled[i * size : (i + 1) * size]
        batch = padded_batch(group, multiple=64)
        kinds = torch.zeros_like(batch["input_ids"])
        for j, example in enumerate(group):
            kinds[j, : len(example["mm_token_type_ids"])] = torch.tensor(example["mm_token_type_ids"])
        batch["labels"] = batch["labels"].masked_fill(kinds != 0, -100)
        batch["mm_token_type_ids"] = kinds
        images = [e for e in group if "pixel_values" in e]
        if images:
            batch["pixel_values"] = torch.cat([e["pixel_values"] for e in images])
            batch["image_grid_thw"] = torch.cat([e["image_grid_thw"] for e in images])
        out.append(batch)
    return out


def text_tokens(batch: dict) -> int:
    """Text tokens that are not padding (image placeholders and padding excluded)."""
    real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(batch["input_ids"]).bool()
    return int((real & (batch["mm_token_type_ids"] == 0)).sum())


def exactness(args, model, device) -> dict:
    examples = make_examples(args, model.config, args.check_examples, seed=5)
    batch = FlatteningCollator()(examples)
    batch.pop("labels")
    model.eval()
    runs = {}
    with torch.no_grad():
        for precision in ("float32", "bfloat16") if device.type == "cuda" else ("float32",):
            model.to(getattr(torch, precision))
            cast = {k: v.to(getattr(torch, precision)) if k == "pixel_values" else v for k, v in batch.items()}
            set_attention(model, args.attn if precision == "bfloat16" else "sdpa")
            runs[f"packed_{precision}"] = model(**to_device(cast, device)).logits[0].float()
            set_attention(model, "sdpa")
            alone = []
            for example in examples:
                one = {
                    k: torch.as_tensor(v)[None] for k, v in example.items() if k in ("input_ids", "mm_token_type_ids")
                }
                if "pixel_values" in example:
                    one["pixel_values"] = example["pixel_values"].to(getattr(torch, precision))
                    one["image_grid_thw"] = example["image_grid_thw"]
                alone.append(model(**to_device(one, device)).logits[0].float())
            runs[f"alone_{precision}"] = torch.cat(alone)
            padded = padded_batches(examples, 1, size=len(examples))[0]
            padded.pop("labels")
            if "pixel_values" in padded:
                padded["pixel_values"] = padded["pixel_values"].to(getattr(torch, precision))
            logits = model(**to_device(padded, device)).logits
            lengths = [len(e["input_ids"]) for e in examples]
            order = _padded_order(examples)
            runs[f"padded_{precision}"] = torch.cat([logits[order[i], :n].float() for i, n in enumerate(lengths)])
    model.train()
    low = "bfloat16" if device.type == "cuda" else "float32"
    return {
        "examples": [
            {"text_and_placeholders": len(e["input_ids"]), "grid": e.get("image_grid_thw", torch.zeros(0)).tolist()}
            for e in examples
        ],  # fmt: skip
        **gaps(runs, low),
    }


def _padded_order(examples: list[dict]) -> list[int]:
    """Where padded_batches puts each example (it shuffles with a fixed seed)."""
    index = list(range(len(examples)))
    random.Random(0).shuffle(index)
    return [index.index(i) for i in range(len(examples))]


def throughput(args, model, device) -> dict:
    cfg, steps = model.config, args.steps + args.warmup
    examples = make_examples(args, cfg, args.examples, seed=0)
    text = int(round(np.mean([len(e["input_ids"]) - sum(e["mm_token_type_ids"]) for e in examples])))
    grids = sorted((e["image_grid_thw"][0, 1:].tolist() for e in examples if "image_grid_thw" in e), key=np.prod)
    same = make_examples(args, cfg, len(examples), seed=0, shape=(text, tuple(grids[len(grids) // 2])))
    plans = {
        "packed": (model, args.attn, packed_rows(examples, args.tokens_per_step, steps)),
        "oracle": (model, args.attn, packed_rows(same, args.tokens_per_step, steps)),
        "padded": (model, "sdpa", padded_batches(examples, steps)),
    }
    result = alternate_modes(plans, args.rounds, device, args.warmup, text_tokens, "mix")
    return {"mean_text_tokens": text, "median_grid": grids[len(grids) // 2], **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attn", default="packing_varlen", help="text attention of the packed rows")
    parser.add_argument("--grids", default=GRIDS, help="image patch grids h x w, drawn uniformly")
    parser.add_argument("--max-text", type=int, default=1024, help="longest text part of an example")
    parser.add_argument("--tokens-per-step", type=int, default=8192, help="tokens (text + placeholders) per row")
    parser.add_argument("--examples", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check-examples", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny float32 model on the CPU, sdpa, 1 round")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    if args.smoke:
        args.attn, args.rounds, args.steps, args.warmup, args.tokens_per_step = "sdpa", 2, 2, 1, 2048
        args.grids, args.examples, args.max_text = "4x4,4x8,8x8", 120, 256
    else:
        register_varlen_attention()
    model = enable_packing(build(args, device, dtype))
    report = {
        "model": "qwen2_5_vl",
        "command": command(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "kernels": kernel_versions(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "paths": packing_layers(model).paths,
        "data": {"grids": args.grids, "max_text": args.max_text, "text_lengths": "sft", "image_examples": "1 in 2"},
        "exactness": exactness(args, model, device),
    }
    print(json.dumps(report, indent=1), flush=True)
    write_merged(args.out, report)  # the exactness survives a failed timing
    report["throughput"] = throughput(args, model, device)
    print(json.dumps(report["throughput"], indent=1))
    write_merged(args.out, report)


if __name__ == "__main__":
    main()
