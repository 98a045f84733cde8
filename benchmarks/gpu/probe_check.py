"""The live packing probe on a GPU: what it costs on a 200M model, and that it works under FSDP.

Cost (one process, one GPU): a 200M Llama-style model (bf16, ``--attn``, default
flash_attention_4) runs, in this order and counting FA4 compiles (``CompileCounter``):

    probe (cold)      probe_packing with FlatteningCollator: compiles the short-sequence kernels
    first step        one 16k-token sampler batch, forward + backward + AdamW (compiles the rest)
    probe (warm) x5   the probe again: its marginal cost, the part the first step does not share
    steps             --steps more training steps (median: the steady-state step)
    forward           one forward of the probe's 21 tokens with autograd on (the probe runs three)

and reports the warm probe against the first step (the issue's bar: well under 1%) and
against a steady step.

FSDP (two processes, ``torchrun --nproc_per_node 2 ... --fsdp 2``): a stock Trainer with
``PackingCheckCallback`` under FSDP (version 1 or 2) trains a small model on

    flatten   examples + FlatteningCollator                  the probe must pass on every rank
    pad       pack_lengths rows + PrePackedCollator(mode="pad")  must be refused on every rank
                                                               (several rows, no cu_seq_lens)

Every rank writes what it saw (passed with the probe's summary, or the refusal's text), so a
hang or a verdict that differs between ranks shows.

    python benchmarks/gpu/probe_check.py cost --out OUT
    torchrun --nproc_per_node 2 benchmarks/gpu/probe_check.py fsdp --fsdp 2 --collator flatten --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import packing_collators  # noqa: F401  (before flash_attn.cute, whose import can change the import path)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import CompileCounter, build_model, command, lengths_of, machine, markov_tokens, to_device, train_step  # noqa: E402


def cost(args) -> dict:
    import torch

    from packing_collators import FlatteningCollator, MultipackBatchSampler, probe_packing
    from packing_collators.trainer._probe import _alone_inputs, _logits, _synthetic_tokens

    counter = CompileCounter()
    device = torch.device("cuda")
    model = build_model(
        argparse.Namespace(size=args.size, vocab=32000, max_length=2048, seed=0), args.attn, device, torch.bfloat16
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    lengths = lengths_of("sft", 4000, seed=3)
    tokens = markov_tokens(lengths, 32000, seed=4)
    batches = iter(MultipackBatchSampler(lengths, 16384, seed=0))
    collate = FlatteningCollator()

    def step() -> float:
        batch = to_device(collate([{"input_ids": tokens[i].tolist()} for i in next(batches)]), device)
        return train_step(model, optimizer, batch)

    compiles = [counter.count]
    cold = probe_packing(model, collate)
    compiles.append(counter.count)
    first_step = step()
    compiles.append(counter.count)
    warm = [probe_packing(model, collate).seconds for _ in range(5)]
    steps = [step() for _ in range(args.steps)]
    compiles.append(counter.count)
    example = _synthetic_tokens(model.config, [21], seed=0)[0]
    inputs = _alone_inputs(example, model.config, collate, device)
    forwards = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        _logits(model, inputs)
        forwards.append(time.perf_counter() - started)
    result = {
        "model": f"{args.size} Llama-style, bf16, {args.attn}",
        "card": torch.cuda.get_device_name(),
        "probe_seconds_cold": cold.seconds,
        "first_step_seconds": first_step,
        "probe_seconds_warm": warm,
        "probe_seconds_warm_median": float(np.median(warm)),
        "median_step_seconds": float(np.median(steps)),
        "forward_seconds_median": float(np.median(forwards)),
        "warm_probe_vs_first_step": float(np.median(warm)) / first_step,
        "warm_probe_vs_step": float(np.median(warm)) / float(np.median(steps)),
        "compiles": {
            "in_cold_probe": compiles[1] - compiles[0],
            "in_first_step": compiles[2] - compiles[1],
            "in_warm_probes_and_later_steps": compiles[3] - compiles[2],
        },
        "compile_seconds": counter.seconds,
        "probe_report": cold.summary(),
        "machine": machine(),
        "command": command(),
    }
    return result


def fsdp(args) -> dict:
    import torch
    from transformers import Trainer, TrainingArguments

    from packing_collators import FlatteningCollator, PackingCheckCallback, PrePackedCollator, pack_lengths

    rank = int(os.environ.get("RANK", 0))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    model = build_model(
        argparse.Namespace(size="200m", vocab=32000, max_length=1024, seed=0), args.attn, "cuda", torch.bfloat16
    )
    lengths = np.minimum(lengths_of("sft", 256, seed=0), 1024)
    examples = markov_tokens(lengths, 32000, seed=0)
    if args.collator == "flatten":
        dataset, collator = [{"input_ids": e.tolist()} for e in examples], FlatteningCollator()
    else:
        result = pack_lengths(lengths, 1024)
        dataset = []
        for row in result.rows:
            seq = [int(lengths[i]) for i in row]
            dataset.append(
                {
                    "input_ids": np.concatenate([examples[i] for i in row]).tolist(),
                    "seq_lengths": seq,
                    "position_ids": np.concatenate([np.arange(n) for n in seq]).tolist(),
                }
            )
        collator = PrePackedCollator(mode="pad", max_length=1024)
    options = dict(
        output_dir=tempfile.mkdtemp(prefix="probe_fsdp_"),
        max_steps=3,
        per_device_train_batch_size=8 if args.collator == "flatten" else 2,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=True,
        disable_tqdm=True,
        remove_unused_columns=False,
        fsdp="full_shard auto_wrap",
        fsdp_config={"version": args.fsdp, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
    )
    callback = PackingCheckCallback()
    trainer = Trainer(
        model=model,
        args=TrainingArguments(**options),
        train_dataset=dataset,
        data_collator=collator,
        callbacks=[callback],
    )
    started = time.perf_counter()
    try:
        trainer.train()
        verdict, text = "passed", callback.last_report.summary()
    except ValueError as error:
        verdict, text = "refused", str(error)
    return {
        "rank": rank,
        "fsdp_version": args.fsdp,
        "collator": args.collator,
        "attn": args.attn,
        "wrapped_as": type(trainer.model_wrapped).__name__,
        "verdict": verdict,
        "text": text,
        "probe_seconds": callback.last_report.seconds if callback.last_report else None,
        "loss": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "seconds": time.perf_counter() - started,
        "card": torch.cuda.get_device_name(),
        "command": "torchrun --nproc_per_node 2 " + " ".join(sys.argv),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("cost", "fsdp"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--attn", default="flash_attention_4")
    parser.add_argument("--size", default="200m", help="cost: the model size (benchmarks/_shared.py SIZES)")
    parser.add_argument("--steps", type=int, default=10, help="cost: steady-state steps after the first")
    parser.add_argument("--fsdp", type=int, choices=(1, 2), default=2, help="fsdp: FSDP version")
    parser.add_argument("--collator", choices=("flatten", "pad"), default="flatten")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "cost":
        result = cost(args)
        name = f"cost_{args.size}_{args.attn}"
    else:
        result = fsdp(args)
        name = f"fsdp{args.fsdp}_{args.collator}_{args.attn}_rank{result['rank']}"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()
