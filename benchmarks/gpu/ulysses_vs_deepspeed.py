"""This library's sequence parallelism beside DeepSpeed's Ulysses (ALST, through accelerate): same packed rows, N=2.

    torchrun --nproc-per-node 2 benchmarks/gpu/ulysses_vs_deepspeed.py --setup ours --out DIR
    torchrun --nproc-per-node 2 benchmarks/gpu/ulysses_vs_deepspeed.py --setup deepspeed --attn sdpa --out DIR
    torchrun --nproc-per-node 2 benchmarks/gpu/ulysses_vs_deepspeed.py --setup deepspeed --attn flash_attention_4 --out DIR
    python benchmarks/gpu/ulysses_vs_deepspeed.py --compare --out DIR

Every setting trains a fresh 1B Llama-style model (seed 0, bf16 weights, AdamW, gradient checkpointing) for one run
over the same rows: --steps packed rows of each --tokens size (random examples, lognormal lengths, each at most half
the row), one optimizer step per row. ``ours`` runs, one after the other: the whole row on one GPU (the reference,
each example attending only to itself), its replay (the noise of that reference), the whole row on one GPU with one
causal sequence over all examples (what attention without the examples' boundaries computes), and
``PackingTrainer``'s sequence parallelism (``shard_flat_batch`` + ``enable_ulysses_attention``) over the two GPUs.
``deepspeed`` runs DeepSpeed's ``UlyssesSPAttentionHF`` and ``UlyssesSPDataLoaderAdapter`` as accelerate wires them
from ``ParallelismConfig(sp_backend="deepspeed")``, with the loss recipe of accelerate's own ALST test; each of its
settings needs its own processes (DeepSpeed replaces transformers' attention function by name, process-wide);
``--zero-stage`` picks its ZeRO stage (0: plain AdamW, as in ours). Every setting records its gradient norm at
step 1, before any update. Only rank 0 writes: ``<setting>.json``; ``--compare`` writes ``comparison.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _shared import model_config, sync, to_device  # noqa: E402
from sequence_parallel import SHAPES, free, packed_row  # noqa: E402

THEIR_KEYS = ("input_ids", "labels", "position_ids")  # what UlyssesSPDataLoaderAdapter shards (dim 1 of each)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for <setting>.json (read by --compare)")
    parser.add_argument("--setup", choices=("ours", "deepspeed"))
    parser.add_argument("--attn", default="flash_attention_4", help="DeepSpeed's core attention (sdpa, flash_...)")
    parser.add_argument("--compare", action="store_true", help="only write comparison.md from the folder's files")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and rows (the CPU check, gloo)")
    parser.add_argument("--tokens", default="32768,65536", help="row sizes, in this order in one run")
    parser.add_argument("--steps", type=int, default=8, help="rows (steps) per size; even: DeepSpeed pairs them")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each size left out of the timing")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument(
        "--vocab", type=int, default=32000, help="the 1B shape's vocabulary (its logits fit 80 GB at 64k)"
    )
    parser.add_argument("--zero-stage", type=int, default=0, choices=(0, 1, 2, 3), help="DeepSpeed's ZeRO stage")
    parser.add_argument("--only", default="", help="ours: a comma list of its settings to run (default all)")
    args = parser.parse_args()
    if args.smoke:
        args.tokens = "256,512"
    return args


def rows(args, vocab: int) -> list[dict]:
    """The run's packed rows, the same in every setting and on every rank."""
    sizes = [int(t) for t in args.tokens.split(",")]
    return [
        packed_row(total, vocab, seed=1000 * n + s, longest=total // 2)
        for n, total in enumerate(sizes)
        for s in range(args.steps)
    ]


def build(args, device, attn: str):
    from transformers import AutoModelForCausalLM

    *dims, vocab = SHAPES["tiny" if args.smoke else "1b"]
    vocab = vocab if args.smoke else args.vocab
    config = model_config(tuple(dims), vocab, max_position_embeddings=1 << 20)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.bfloat16)
    from packing_collators._compat import enable_activation_checkpointing

    enable_activation_checkpointing(model, {"use_reentrant": False})
    return model.train()


class Log:
    """One setting's per-step losses, seconds and tokens; rank 0 writes them to ``<name>.json``."""

    def __init__(self, args, name: str, device, **about) -> None:
        self.args, self.name, self.device = args, name, device
        self.steps: list[dict] = []
        self.about = about
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def add(self, tokens: int, loss: float, seconds: float) -> None:
        self.steps.append({"tokens": tokens, "loss": loss, "seconds": seconds})

    def write(self, gpus: int) -> dict:
        peak = torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None
        by_size = {}
        for total in sorted({s["tokens"] for s in self.steps}):
            timed = [s["seconds"] for s in self.steps if s["tokens"] == total][self.args.warmup :]
            by_size[str(total)] = {
                "median_step_s": float(np.median(timed)),
                "tokens_per_s_per_gpu": total / float(np.median(timed)) / gpus,
            }
        data = {
            "setting": self.name,
            "gpus": gpus,
            "device": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "peak_allocated_gib": peak,
            "command": " ".join(["torchrun --nproc-per-node", os.environ.get("WORLD_SIZE", "1"), *sys.argv]),
            "timed": by_size,
            "steps": self.steps,
            **self.about,
        }
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == 0:
            out = Path(self.args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{self.name}.json").write_text(json.dumps(data, indent=1))
            print(json.dumps({k: v for k, v in data.items() if k != "steps"}), flush=True)
            print("losses:", [round(s["loss"], 5) for s in self.steps], flush=True)
        return data


def grad_norm(grads) -> float:
    """The L2 norm of all gradients, in float32."""
    return float(torch.sqrt(sum(g.detach().float().pow(2).sum() for g in grads if g is not None)))


def _timed(device, work) -> tuple[float, float]:
    sync(device)
    began = time.perf_counter()
    loss = work()
    sync(device)
    return loss, time.perf_counter() - began


def one_gpu(args, device, attn: str, name: str, *, cross: bool = False) -> None:
    """The whole row on this GPU (every rank runs the same, independently); ``cross``: one causal sequence."""
    model = build(args, device, attn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    log = Log(args, name, device, attention=attn, examples_attend_across=cross)
    for row in rows(args, model.config.vocab_size):
        total = row["input_ids"].shape[1]
        if cross:  # the positions still restart per example; attention runs over the whole row, causal
            whole = torch.tensor([0, total], dtype=torch.int32)
            row = {**row, "cu_seq_lens_q": whole, "cu_seq_lens_k": whole, "max_length_q": total, "max_length_k": total}
            if attn == "sdpa":  # sdpa reads the examples from restarting positions unless a mask is given
                row = {**row, "attention_mask": torch.ones_like(row["input_ids"])}

        def work():
            loss = model(**to_device(row, device)).loss
            loss.backward()
            if not log.steps:  # the first step's gradient, before any update: the same in every setting
                log.about["grad_norm_step1"] = grad_norm(p.grad for p in model.parameters())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss.detach())

        log.add(total, *_timed(device, work))
    log.write(gpus=1)


def ours_sp(args, device, attn: str) -> None:
    from packing_collators.parallel import enable_ulysses_attention, sequence_parallel_mesh, shard_flat_batch

    mesh = sequence_parallel_mesh(dist.get_world_size())
    model = build(args, device, attn)
    inner = enable_ulysses_attention(model, mesh.sp_group, mesh.size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    log = Log(args, "ours_sp2", device, attention=inner)
    for row in rows(args, model.config.vocab_size):

        def work():
            batch = to_device(shard_flat_batch(row, rank=mesh.sp_rank, size=mesh.size), device)
            targets = batch["shift_labels"].ne(-100).sum()
            dist.all_reduce(targets, group=mesh.sp_group)
            loss = model(**batch, num_items_in_batch=targets).loss  # this shard's sum / the row's targets
            loss.backward()
            for p in model.parameters():  # the row's gradient is the shards' sum
                dist.all_reduce(p.grad, group=mesh.sp_group)
            if not log.steps:
                log.about["grad_norm_step1"] = grad_norm(p.grad for p in model.parameters())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss = loss.detach().clone()
            dist.all_reduce(loss, group=mesh.sp_group)
            return float(loss)

        log.add(row["input_ids"].shape[1], *_timed(device, work))
    log.write(gpus=mesh.size)


def ours(args, device) -> None:
    if args.device == "cpu":
        attn = "sdpa"
    else:
        from packing_collators import register_fa4_attention

        attn = register_fa4_attention()
    settings = {
        "one_gpu": lambda: one_gpu(args, device, attn, "one_gpu"),
        "one_gpu_replay": lambda: one_gpu(args, device, attn, "one_gpu_replay"),
        "one_gpu_cross": lambda: one_gpu(args, device, attn, "one_gpu_cross", cross=True),
        "ours_sp2": lambda: ours_sp(args, device, attn),
    }
    for name, run in settings.items():
        if not args.only or name in args.only.split(","):
            run()
            free()  # the setting's model and optimizer went with its frame


def _fa4_int_lengths() -> None:
    """transformers 5.17, deriving the examples from position_ids, hands FA4 its max lengths as 0-d tensors, which
    FA4 4.0.0b36 refuses ("Expected IntTuple ... got 9115"); pass them as ints. Reading the tensor syncs the host
    once per attention call, on DeepSpeed's path only; transformers already syncs there to find the boundaries."""
    import flash_attn.cute as cute

    varlen = cute.flash_attn_varlen_func

    def as_ints(*args, max_seqlen_q=None, max_seqlen_k=None, **kwargs):
        q, k = (int(v) if torch.is_tensor(v) else v for v in (max_seqlen_q, max_seqlen_k))
        return varlen(*args, max_seqlen_q=q, max_seqlen_k=k, **kwargs)

    cute.flash_attn_varlen_func = as_ints


def deepspeed_setting(args, device) -> None:
    """DeepSpeed's Ulysses through accelerate, as its ALST test drives it (loss: the shards' token-weighted mean)."""
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, ParallelismConfig
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig

    world = int(os.environ["WORLD_SIZE"])  # accelerate starts the process group below
    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True, sp_attn_implementation="sdpa")
    # accelerate 1.15 accepts only flash_attention_2/3, sdpa or a Hub kernel here; neither FA2 nor FA3 installs on
    # the GPU image, FA4 does. DeepSpeed itself takes any name transformers has registered, so set it afterwards.
    handler.sp_attn_implementation = args.attn
    parallelism = ParallelismConfig(sp_backend="deepspeed", sp_size=world, sp_handler=handler)
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.zero_stage},  # 0: plain AdamW on the bf16 weights, as in ours
        "gradient_clipping": 0.0,
    }
    if args.attn == "flash_attention_4":
        _fa4_int_lengths()
    accelerator = Accelerator(parallelism_config=parallelism, deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config))
    model = build(args, accelerator.device, args.attn)
    vocab = model.config.vocab_size
    all_rows = rows(args, vocab)
    # The adapter takes one batch from each rank's loader and runs them in rank order, each over the whole group.
    # Rank r's loader holds rows r, r + world, ...: the adapter then runs every row once, in order (checked at every
    # step below). The loader is wrapped by accelerator.deepspeed_ulysses_dl_adapter (accelerate's path for a loader
    # prepared apart from the model, HF Trainer's) and not given to prepare(): whether prepare() shards it across
    # the ranks differed between CPU and GPU (on CPU both ranks got row 0 first: every row would run twice).
    theirs = [{k: r[k] for k in THEIR_KEYS} for r in all_rows[int(os.environ["RANK"]) :: world]]
    loader = torch.utils.data.DataLoader(theirs, batch_size=1, collate_fn=lambda b: b[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, optimizer = accelerator.prepare(model, optimizer)
    loader = accelerator.deepspeed_ulysses_dl_adapter(loader, engine)
    unwrapped = accelerator.unwrap_model(engine)
    from deepspeed.utils import groups, safe_get_full_grad

    group, rank = groups._get_sequence_parallel_group(), groups._get_sequence_parallel_rank()
    name = f"deepspeed_{args.attn}" + (f"_zero{args.zero_stage}" if args.zero_stage else "")
    log = Log(args, name, device, attention=args.attn, zero_stage=args.zero_stage)
    batches = iter(loader)
    for index, row in enumerate(all_rows):
        total = row["input_ids"].shape[1]

        def work():
            batch = next(batches)
            width = total // world
            expected = row["input_ids"][:, rank * width : (rank + 1) * width]
            if not torch.equal(batch["input_ids"].cpu(), expected):
                raise RuntimeError(f"step {index}: DeepSpeed's adapter gave this rank another row's shard")
            batch = to_device(batch, accelerator.device)
            shift_labels = batch["shift_labels"]
            logits = engine(**batch).logits
            loss = unwrapped.loss_function(logits=logits, labels=None, shift_labels=shift_labels, vocab_size=vocab)
            losses = torch.distributed.nn.functional.all_gather(loss, group=group)
            good = shift_labels.ne(-100).sum()
            goods = torch.distributed.nn.functional.all_gather(good, group=group)
            loss = sum(part * n for part, n in zip(losses, goods) if n > 0) / max(sum(goods), 1)
            if log.steps:
                accelerator.backward(loss)  # DeepSpeed's engine.backward, then engine.step
            else:  # the same two calls, with the gradient's norm read between them
                engine.set_gradient_accumulation_boundary(is_boundary=True)
                engine.backward(loss)
                log.about["grad_norm_step1"] = grad_norm(safe_get_full_grad(p) for p in engine.module.parameters())
                engine.step()
            optimizer.step()
            optimizer.zero_grad()
            return float(loss.detach())

        log.add(total, *_timed(device, work))
    log.write(gpus=world)


def compare(folder: Path) -> str:
    """comparison.md: tokens/s per GPU, peak memory and the per-step loss gap to the one-GPU run, per setting."""
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    reference = runs.get("one_gpu")
    if reference is None:
        raise SystemExit(f"{folder}: no one_gpu.json (run --setup ours first)")
    sizes = list(reference["timed"])
    order = ["one_gpu", "one_gpu_replay", "one_gpu_cross", "ours_sp2"] + sorted(
        k for k in runs if k.startswith("deepspeed")
    )
    header = "| setting | GPUs | attention | " + " | ".join(f"tokens/s per GPU, {int(s):,}-token rows" for s in sizes)
    header += (
        " | peak GiB per GPU | max loss diff vs one GPU | loss diff at step 1 | max loss diff vs one causal sequence |"
    )
    norms = "grad_norm_step1" in reference  # runs made before the harness read it have none
    header += " gradient norm at step 1 / one GPU's |" if norms else ""
    lines = [
        f"Card: {reference['device']}; torch {reference['torch']}.",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
    ]
    ref_losses = [s["loss"] for s in reference["steps"]]
    cross = [s["loss"] for s in runs["one_gpu_cross"]["steps"]] if "one_gpu_cross" in runs else None
    for name in (n for n in order if n in runs):
        run = runs[name]
        speeds = " | ".join(
            f"{run['timed'][s]['tokens_per_s_per_gpu']:,.0f}" if s in run["timed"] else "-" for s in sizes
        )
        diffs = [abs(s["loss"] - r) for s, r in zip(run["steps"], ref_losses)]
        peak = f"{run['peak_allocated_gib']:.1f}" if run.get("peak_allocated_gib") is not None else "-"
        to_cross = f"{max(abs(s['loss'] - c) for s, c in zip(run['steps'], cross)):.4f}" if cross else "-"
        line = f"| {name} | {run['gpus']} | {run['attention']} | {speeds} | {peak} | {max(diffs):.4f} | {diffs[0]:.4f} | {to_cross} |"
        if norms:
            line += (
                f" {run['grad_norm_step1'] / reference['grad_norm_step1']:.3f} |"
                if "grad_norm_step1" in run
                else " - |"
            )
        lines.append(line)
    lines += ["", "Per-step losses:", "", "| step | tokens | " + " | ".join(n for n in order if n in runs) + " |"]
    lines.append("|" + "---|" * (2 + sum(n in runs for n in order)))
    for i, step in enumerate(reference["steps"]):
        cells = " | ".join(f"{runs[n]['steps'][i]['loss']:.4f}" for n in order if n in runs)
        lines.append(f"| {i + 1} | {step['tokens']} | {cells} |")
    text = "\n".join(lines) + "\n"
    (folder / "comparison.md").write_text(text)
    return text


def main() -> None:
    args = _arguments()
    if args.compare:
        print(compare(Path(args.out)))
        return
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.setup == "ours":
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    began = time.perf_counter()
    ours(args, device) if args.setup == "ours" else deepspeed_setting(args, device)
    if dist.is_initialized():
        dist.barrier()
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"done in {time.perf_counter() - began:.0f} s", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
