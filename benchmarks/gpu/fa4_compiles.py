"""Which training batches still make FlashAttention-4 compile after ``warm_up_attention``, and why.

FA4 compiles one kernel per compile key (dtype, head dims, GQA packing, split-KV, tile
and scheduler choices, ...), and some of those choices follow the batch: its number of
sequences, its longest one. This script warms a 200M model up the way PackingTrainer's
benchmarks do, then runs forward + backward on ``--batches`` sampler batches (the
``trainer_scaling.py`` plan: ``sft`` lengths, 16,384 tokens per batch, 2 ranks) and, for
every batch that compiled, prints the batch's shape (sequences, max_length_q) and the new
compile keys of each FA4 entry point next to the nearest key compiled before, field by field.

    python benchmarks/gpu/fa4_compiles.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import packing_collators  # noqa: F401  (before flash_attn.cute, whose import can change the import path)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import build_model, command, lengths_of, markov_tokens, to_device  # noqa: E402


def cache_keys() -> dict[str, set]:
    import flash_attn.cute.interface as interface

    keys = {}
    for name, value in vars(interface).items():
        cache = getattr(value, "compile_cache", None)
        cache = getattr(cache, "cache", cache)
        if cache is not None and hasattr(cache, "keys"):
            keys[name] = set(cache.keys())
    return keys


def nearest(key, known) -> list:
    """The fields (index: old -> new) where ``key`` differs from the known key with the fewest differences."""
    best = None
    for other in known:
        if not isinstance(other, tuple) or not isinstance(key, tuple) or len(other) != len(key):
            continue
        diff = [(i, repr(a), repr(b)) for i, (a, b) in enumerate(zip(other, key)) if a != b]
        if best is None or len(diff) < len(best):
            best = diff
    return best if best is not None else [("no comparable key", "", repr(key)[:300])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, default=120)
    parser.add_argument("--size", default="200m")
    parser.add_argument("--no-warm-up", action="store_true")
    args = parser.parse_args()
    import torch

    from packing_collators import FlatteningCollator, MultipackBatchSampler, warm_up_attention

    device = torch.device("cuda")
    model = build_model(
        argparse.Namespace(size=args.size, vocab=32000, max_length=2048, seed=0),
        "flash_attention_4",
        device,
        torch.bfloat16,
    )
    if not args.no_warm_up:
        warm_up_attention(model, max_length=2048)
    lengths = np.minimum(lengths_of("sft", 20000, seed=0), 2048)
    tokens = markov_tokens(lengths, 32000, seed=0)
    samplers = [
        MultipackBatchSampler(lengths, 16384, seed=0, num_replicas=2, rank=r, check_ranks=False) for r in (0, 1)
    ]
    batches = [b for pair in zip(*samplers) for b in pair][: args.batches]
    collate = FlatteningCollator()
    known = cache_keys()
    events = []
    for step, indices in enumerate(batches):
        batch = to_device(collate([{"input_ids": tokens[i].tolist()} for i in indices]), device)
        model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)
        now = cache_keys()
        new = {name: now[name] - known.get(name, set()) for name in now if now[name] - known.get(name, set())}
        if new:
            event = {
                "batch": step,
                "sequences": len(indices),
                "max_length_q": int(batch["max_length_q"]),
                "tokens": int(lengths[indices].sum()),
                "new_keys": {
                    name: [nearest(key, known.get(name, set())) for key in keys] for name, keys in new.items()
                },
            }
            events.append(event)
            print(json.dumps(event), flush=True)
        known = now
    shapes = [(len(b), int(lengths[b].max())) for b in batches]
    result = {
        "card": torch.cuda.get_device_name(),
        "warm_up": not args.no_warm_up,
        "batches": len(batches),
        "batches_that_compiled": events,
        "sequences_range": [min(s for s, _ in shapes), max(s for s, _ in shapes)],
        "max_length_q_range": [min(m for _, m in shapes), max(m for _, m in shapes)],
        "command": command(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fa4_compiles.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "batches_that_compiled"}))


if __name__ == "__main__":
    main()
