"""How much bigger ``max_tokens_per_batch="auto"`` gets when the loss skips the full logits, per vocabulary.

    python benchmarks/gpu/memory_budget_vocab.py --out DIR [--vocabs 32000,151936,248320] [--longest 2048]

For each vocabulary (and gradient checkpointing off, by default), a fresh 1B Llama-style model (hidden 2048, 16
layers, 32/8 heads, MLP 8192; bf16 weights, AdamW's two states per parameter counted) on one GPU is
measured by ``measure_token_budget`` twice: with ``loss_implementation="full"`` (the model's own loss:
the T x V logits and their float32 copy) and ``"auto"`` (the loss a chunk of tokens at a time, what
PackingTrainer trains with). Each budget is the largest micro-batch whose measured training step fits
90% of the card. Writes DIR/memory_budget_vocab.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _model(vocab: int, checkpointing: bool, attention: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=8192, max_position_embeddings=65536, use_cache=False,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.set_attn_implementation(attention)
    if checkpointing:
        from packing_collators._compat import enable_activation_checkpointing

        enable_activation_checkpointing(model, {"use_reentrant": False})
    return model.train()


def main() -> None:
    from packing_collators import choose_attention, measure_token_budget

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocabs", default="32000,151936,248320")
    parser.add_argument("--longest", type=int, default=2048)
    parser.add_argument("--checkpointing", default="off", help="off, on or off,on (on: budgets of 100k+ tokens, slow)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for vocab in (int(v) for v in args.vocabs.split(",")):
        for checkpointing in (c == "on" for c in args.checkpointing.split(",")):
            row = {"vocab": vocab, "gradient_checkpointing": checkpointing}
            for implementation in ("full", "auto"):
                started = time.time()
                model = _model(vocab, checkpointing, "sdpa")
                attention = choose_attention(model, "auto")
                budget = measure_token_budget(model, longest=args.longest, loss_implementation=implementation)
                row[implementation] = {
                    "max_tokens_per_batch": budget.max_tokens_per_batch, "bytes_per_token": budget.bytes_per_token,
                    "base_gib": budget.base_bytes / (1 << 30), "seconds": time.time() - started, "attention": attention,
                }
                print(vocab, checkpointing, implementation, budget.summary(), flush=True)
                del model
                torch.cuda.empty_cache()
            row["auto_over_full"] = row["auto"]["max_tokens_per_batch"] / row["full"]["max_tokens_per_batch"]
            rows.append(row)
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    (out / "memory_budget_vocab.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    lines = ["| vocabulary | gradient checkpointing | budget, full logits | budget, chunked loss | chunked / full |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['vocab']} | {'on' if r['gradient_checkpointing'] else 'off'} | "
                     f"{r['full']['max_tokens_per_batch']} | {r['auto']['max_tokens_per_batch']} | {r['auto_over_full']:.2f}x |")
    (out / "memory_budget_vocab.md").write_text(f"{header}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
