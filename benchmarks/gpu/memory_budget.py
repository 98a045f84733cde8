"""measure_token_budget on a GPU: does training at the measured budget fit, and how close is it to the edge?

For each configuration (a Llama-style model from ``_shared.SIZES``, bf16 weights, fused AdamW,
``packing_varlen``, optionally gradient checkpointing), with examples of ``--longest`` tokens:

    budget     measure_token_budget(model, longest=L, memory_fraction=0.9): two dry runs
    at budget  2 optimizer steps on flat batches of `budget` tokens (examples of L tokens, the last
               one shorter): the peak memory allocated, as a share of the card (must stay <= 0.9)
    at 1.15x   the same with 15% more tokens: how much room the budget leaves (may run out of memory)
    refusal    measure_token_budget with a longest example that cannot fit (--too-long tokens): the
               ValueError, raised before any training step, and how long it took

    python benchmarks/gpu/memory_budget.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import build_model, command  # noqa: E402


def train_at(model, optimizer, tokens: int, longest: int) -> dict:
    import torch

    from packing_collators import FlatteningCollator

    lengths = [longest] * (tokens // longest) + ([tokens % longest] if tokens % longest else [])
    vocab = model.config.vocab_size
    batch = FlatteningCollator()([{"input_ids": torch.randint(0, vocab, (n,))} for n in lengths])
    batch = {k: v.cuda() if hasattr(v, "cuda") else v for k, v in batch.items()}
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    try:
        for _ in range(2):
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return {"tokens": tokens, "out_of_memory": True}
    total = torch.cuda.get_device_properties(0).total_memory
    peak = torch.cuda.max_memory_allocated()
    return {
        "tokens": tokens,
        "out_of_memory": False,
        "peak_gib": peak / 2**30,
        "peak_share": peak / total,
        "step_seconds": (time.perf_counter() - started) / 2,
    }


SHARES = (0.5, 0.75, 1.0, 1.15)


def run(size: str, checkpointing: bool, longest: int, too_long: int) -> dict:
    import torch

    from packing_collators import measure_token_budget, register_varlen_attention

    model = build_model(
        argparse.Namespace(size=size, vocab=32000, max_length=max(longest, too_long), seed=0),
        register_varlen_attention(),
        "cuda",
        torch.bfloat16,
    )
    if checkpointing:
        model.gradient_checkpointing_enable()
    started = time.perf_counter()
    budget = measure_token_budget(model, longest=longest, memory_fraction=0.9)
    measured = time.perf_counter() - started
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    result = {
        "size": size,
        "gradient_checkpointing": checkpointing,
        "longest": longest,
        "budget": budget.max_tokens_per_batch,
        "summary": budget.summary(),
        "measure_seconds": measured,
    }
    for share in SHARES:  # the measured line checked along the way to the budget and past it
        result[f"at_{share}x"] = train_at(model, optimizer, int(budget.max_tokens_per_batch * share), longest)
    started = time.perf_counter()
    try:
        measure_token_budget(model, longest=too_long, optimizer_states_per_parameter=0)
        result["refusal"] = f"not refused at {too_long} tokens"
    except ValueError as error:
        result["refusal"] = str(error)
    result["refusal_seconds"] = time.perf_counter() - started
    del optimizer, model
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--longest", type=int, default=8192)
    parser.add_argument("--too-long", type=int, default=4_000_000)
    parser.add_argument("--sizes", default="200m,1b+ckpt", help="model sizes; +ckpt turns on gradient checkpointing")
    args = parser.parse_args()
    import torch

    results = []
    for name in args.sizes.split(","):
        results.append(run(name.removesuffix("+ckpt"), name.endswith("+ckpt"), args.longest, args.too_long))
        print(json.dumps(results[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"card": torch.cuda.get_device_name(), "command": command(), "runs": results}
    (args.out / "memory_budget.json").write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
