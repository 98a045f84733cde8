"""Sequence parallelism (Ulysses over packed rows): exact, longer, and how fast, N=2 vs one GPU.

    torchrun --nproc-per-node 2 benchmarks/gpu/sequence_parallel.py --out benchmarks/results/sequence_parallel_h100x2
    torchrun --nproc-per-node 2 benchmarks/gpu/sequence_parallel.py --device cpu --smoke --out /tmp/sp_smoke

About 7 minutes on 2 H100s, 90 s for the CPU smoke. Parts (exact, longest, throughput, trainer), the
results schema and the time caps: see docs/benchmarks.md#sequence_parallelpy.
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

from packing_collators import FlatteningCollator
from packing_collators.parallel import enable_ulysses_attention, sequence_parallel_mesh, shard_flat_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _shared module
from _shared import model_config, sync, to_device, training_arguments  # noqa: E402

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab
    "exact": (768, 4, 12, 4, 2048, 32000),
    "1b": (2048, 16, 32, 8, 8192, 128256),
    "8b_layers": (4096, None, 32, 8, 14336, 128256),
    "tiny": (64, 2, 4, 2, 128, 256),
}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for results.json")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and lengths (the CPU check)")
    parser.add_argument("--parts", default="exact,longest,throughput,trainer")
    parser.add_argument("--exact-steps", type=int, default=4)
    parser.add_argument("--exact-tokens", type=int, default=16384)
    parser.add_argument("--start-tokens", type=int, default=16384)
    parser.add_argument("--big-layers", type=int, default=8)
    parser.add_argument("--throughput-tokens", default="32768,65536")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exact-cap", type=float, default=75.0, help="seconds for part 1")
    parser.add_argument("--longest-cap", type=float, default=75.0, help="seconds per search of part 2")
    parser.add_argument("--throughput-cap", type=float, default=45.0, help="seconds per setting of part 3")
    parser.add_argument("--total-cap", type=float, default=360.0, help="seconds for everything (then parts stop)")
    args = parser.parse_args()
    if args.smoke:
        args.exact_tokens, args.start_tokens, args.throughput_tokens = 256, 128, "256,512"
        args.big_layers, args.exact_steps, args.repeats = 2, 3, 2
        args.longest_cap, args.throughput_cap = 8.0, 10.0
    return args


class Run:
    """The process group, the device, the attention and the results file."""

    def __init__(self, args) -> None:
        self.args = args
        self.deadline = time.perf_counter() + args.total_cap
        if "WORLD_SIZE" in os.environ:
            backend = "nccl" if args.device == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=180))
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        if args.device == "cuda":
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
        cuda = args.device == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.mesh = sequence_parallel_mesh(self.world) if self.world > 1 else None
        self.attn = self._attention()
        self.results: list[dict] = []
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)

    def _attention(self) -> str:
        if self.args.device == "cpu":
            return "sdpa"
        try:
            import flash_attn.cute  # noqa: F401

            from packing_collators import register_fa4_attention

            return register_fa4_attention()
        except ImportError:
            from packing_collators import register_varlen_attention

            return register_varlen_attention()

    def record(self, **entry) -> None:
        entry = {
            "sequence_parallel_size": 1,
            "longest_example_tokens": None,
            "tokens_per_s_per_gpu": None,
            "max_loss_diff_vs_1gpu": None,
            **entry,
        }
        self.results.append(entry)
        if self.rank == 0:
            print(json.dumps(entry), flush=True)
            device = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
            data = {
                "device": device,
                "world_size": self.world,
                "attention": self.attn,
                "torch": torch.__version__,
                "command": f"torchrun --nproc-per-node {self.world} benchmarks/gpu/sequence_parallel.py {' '.join(sys.argv[1:])}",
                "results": self.results,
            }
            (self.out / "results.json").write_text(json.dumps(data, indent=1))

    def go(self, started: float, cap: float, *, together: bool = True) -> bool:
        """Whether a part started at ``started`` may go on (its cap, the total cap); agreed over ranks."""
        now = time.perf_counter()
        ok = now - started < cap and now < self.deadline
        return self.agree(ok) if together else ok

    def agree(self, ok: bool) -> bool:
        """True when every rank says True."""
        if not dist.is_initialized():
            return ok
        flag = torch.tensor([0 if ok else 1], device=self.device)
        dist.all_reduce(flag)
        return int(flag) == 0


def build(
    run: Run,
    shape: str,
    *,
    arch: str = "llama",
    layers: int | None = None,
    dtype=torch.float32,
    checkpointing: bool = False,
):
    from transformers import AutoModelForCausalLM

    *dims, vocab = SHAPES["tiny" if run.args.smoke else shape]
    dims[1] = layers or dims[1] or 2
    window = {"sliding_window": 64 if run.args.smoke else 4096} if arch == "mistral" else {}
    config = model_config(tuple(dims), vocab, arch=arch, max_position_embeddings=1 << 20, **window)
    torch.manual_seed(0)
    with torch.device(run.device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=run.attn, dtype=dtype)
    if checkpointing:
        from packing_collators._compat import enable_activation_checkpointing

        enable_activation_checkpointing(model, {"use_reentrant": False})
    return model.train()


def packed_row(total: int, vocab: int, seed: int, longest: int | None = None) -> dict:
    """One flat row of ``total`` tokens: random examples (lognormal lengths, at most ``longest``)."""
    rng = np.random.default_rng(seed)
    lengths, left = [], total
    while left > 0:
        n = int(min(left, longest or total, max(16, rng.lognormal(np.log(total / 6), 0.8))))
        lengths.append(n)
        left -= n
    features = [{"input_ids": rng.integers(1, vocab, n).tolist()} for n in lengths]
    return FlatteningCollator()(features)


def step(run: Run, model, optimizer, row: dict, *, sharded: bool, autocast: bool) -> float:
    """One optimizer step on ``row``: whole (one GPU) or this rank's shard; returns the row's mean loss."""
    if sharded:
        batch = to_device(shard_flat_batch(row, rank=run.mesh.sp_rank, size=run.mesh.size), run.device)
        targets = batch["shift_labels"].ne(-100).sum()
        dist.all_reduce(targets, group=run.mesh.sp_group)
        batch["num_items_in_batch"] = targets
    else:
        batch = to_device(row, run.device)
    with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
    fsdp = getattr(model, "_fsdp", False)  # FSDP2 averages gradients over the group; the shards' sum is wanted
    (loss * (run.mesh.size if sharded and fsdp else 1)).backward()
    if sharded:
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=run.mesh.sp_group)
        if not fsdp:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=run.mesh.sp_group)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def free() -> None:
    """Return cached blocks to the GPU (the caller has dropped its references first)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def exact(run: Run) -> None:
    """Part 1: per-step losses, N=2 vs the one-GPU run of the same rows, and that run's replay noise."""
    args, started = run.args, time.perf_counter()
    vocab = SHAPES["tiny" if args.smoke else "exact"][5]
    tokens = args.exact_tokens
    rows = [packed_row(tokens, vocab, seed=s, longest=tokens // 2) for s in range(args.exact_steps)]
    for arch in ("llama", "qwen2", "mistral"):
        if not run.go(started, args.exact_cap):
            print(f"exact: time cap reached before {arch}", flush=True)
            break
        curves = []
        for sharded in (False, False, run.mesh is not None):
            model = build(run, "exact", arch=arch)
            if sharded:
                enable_ulysses_attention(model, run.mesh.sp_group, run.mesh.size)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            curves.append([step(run, model, optimizer, row, sharded=sharded, autocast=True) for row in rows])
            del model, optimizer
            free()
        noise = max(abs(a - b) for a, b in zip(curves[0], curves[1]))
        entry = dict(
            part="exact",
            model=arch,
            dtype="bfloat16 autocast",
            tokens_per_step=args.exact_tokens,
            losses_1gpu=curves[0],
            losses_1gpu_replay=curves[1],
            replay_noise=noise,
        )
        if run.mesh is not None:
            entry.update(
                sequence_parallel_size=run.mesh.size,
                losses=curves[2],
                max_loss_diff_vs_1gpu=max(abs(a - b) for a, b in zip(curves[0], curves[2])),
            )
        run.record(**entry)


def _try_step(run: Run, model, optimizer, row: dict, sharded: bool) -> float | None:
    """Seconds of one synchronised step on ``row`` (no bf16 autocast), or None where it ran out of memory here."""
    sync(run.device)
    began = time.perf_counter()
    try:
        step(run, model, optimizer, row, sharded=sharded, autocast=False)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
        if not isinstance(error, torch.cuda.OutOfMemoryError) and "out of memory" not in str(error).lower():
            raise
        optimizer.zero_grad(set_to_none=True)
        return None
    sync(run.device)
    return time.perf_counter() - began


def _fits(run: Run, model, optimizer, length: int, vocab: int, sharded: bool) -> tuple[bool, float]:
    """Whether one step on a single example of ``length`` tokens fits, on every rank; and its seconds."""
    seconds = _try_step(run, model, optimizer, packed_row(length, vocab, seed=length, longest=length), sharded)
    free()
    return (run.agree(seconds is not None) if sharded else seconds is not None), seconds or 0.0


def _search(run: Run, model, optimizer, vocab: int, sharded: bool) -> tuple[int, str]:
    """Doubling from --start-tokens until out of memory or the cap; then one step halfway back."""
    args, started = run.args, time.perf_counter()
    good, bad, length = 0, None, args.start_tokens
    while run.go(started, args.longest_cap, together=sharded):
        ok, seconds = _fits(run, model, optimizer, length, vocab, sharded)
        if run.rank == 0:
            verdict = "ok" if ok else "out of memory"
            print(f"longest: {length} tokens, sharded={sharded}: {verdict} ({seconds:.1f} s)", flush=True)
        if not ok:
            bad = length
            break
        good, length = length, length * 2
    # after an out-of-memory inside FSDP's backward its hooks' state is not trusted: no second try there
    retry = bad is not None and good and not getattr(model, "_fsdp", False)
    if retry and run.go(started, args.longest_cap, together=sharded):
        middle = (good + bad) // 2
        if _fits(run, model, optimizer, middle, vocab, sharded)[0]:
            good = middle
    stop = "out of memory" if bad is not None else "time cap"
    return good, stop


def _longest_model(run: Run, shape: str, sharded: bool):
    layers = run.args.big_layers if shape == "8b_layers" else None
    model = build(run, shape, layers=layers, dtype=torch.bfloat16, checkpointing=True)
    if sharded:
        enable_ulysses_attention(model, run.mesh.sp_group, run.mesh.size)
        if shape == "8b_layers":
            from torch.distributed.fsdp import fully_shard

            for layer in model.model.layers:
                fully_shard(layer, mesh=run.mesh.mesh["sp"])
            fully_shard(model, mesh=run.mesh.mesh["sp"])
            model._fsdp = True
    return model


def longest(run: Run) -> None:
    """Part 2: the longest single example that trains one step, one GPU vs the group."""
    for shape in ("1b", "8b_layers"):
        for sharded in (False, run.mesh is not None) if run.mesh is not None else (False,):
            model = _longest_model(run, shape, sharded)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            vocab = model.config.vocab_size
            tokens, stop = _search(run, model, optimizer, vocab, sharded)
            run.record(
                part="longest",
                model=shape,
                layers=model.config.num_hidden_layers,
                parameters=sum(p.numel() for p in model.parameters()),  # DTensor: the whole
                sequence_parallel_size=run.mesh.size if sharded else 1,
                longest_example_tokens=tokens,
                stopped_by=stop,
                gradient_checkpointing=True,
                fsdp=bool(sharded and shape == "8b_layers"),
                weights="bf16, AdamW states bf16",
            )
            del model, optimizer
            free()


def throughput(run: Run) -> None:
    """Part 3: real tokens/s per GPU on packed rows of 32k / 64k tokens at 1B, one GPU vs the group."""
    args = run.args
    for total in (int(t) for t in args.throughput_tokens.split(",")):
        for sharded in (False, True) if run.mesh is not None else (False,):
            model = build(run, "1b", dtype=torch.bfloat16, checkpointing=True)
            if sharded:
                enable_ulysses_attention(model, run.mesh.sp_group, run.mesh.size)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            vocab = model.config.vocab_size
            rows = [packed_row(total, vocab, seed=s, longest=total // 2) for s in range(args.repeats + 1)]
            seconds, started, ok = [], time.perf_counter(), True
            for index, row in enumerate(rows):
                if not run.go(started, args.throughput_cap, together=sharded):
                    break
                took = _try_step(run, model, optimizer, row, sharded)
                ok = run.agree(took is not None) if sharded else took is not None
                if not ok:
                    break
                if index:  # the first step compiles and warms up
                    seconds.append(took)
            gpus = run.mesh.size if sharded else 1
            speed = total / float(np.median(seconds)) / gpus if ok and seconds else None
            run.record(
                part="throughput",
                model="1b",
                tokens_per_step=total,
                sequence_parallel_size=gpus,
                tokens_per_s_per_gpu=speed,
                step_seconds=seconds,
                fits=ok,
                gradient_checkpointing=True,
            )
            del model, optimizer, rows
            free()


def trainer(run: Run) -> None:
    """Part 4: PackingTrainer(sequence_parallel_size=N) end to end for 3 steps (the probe, the hooks, bf16)."""
    import datasets

    from packing_collators import PackingTrainer

    if run.mesh is None:
        return
    model = build(run, "exact")
    rng = np.random.default_rng(0)
    low, high, budget = (8, 64, 64) if run.args.smoke else (256, 8192, 8192)
    lengths = rng.integers(low, high, 48)
    ids = [rng.integers(1, model.config.vocab_size, n).tolist() for n in lengths]
    cuda = run.device.type == "cuda"
    steps = argparse.Namespace(warmup=0, steps=3, lr=1e-4, seed=0)  # DDP's defaults kept, as before
    args = training_arguments(steps, cuda, bf16=cuda, ddp_find_unused_parameters=None, ddp_broadcast_buffers=None)
    run_ = PackingTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"input_ids": ids}),
        max_tokens_per_batch=budget,
        sequence_parallel_size=run.mesh.size,
        attn_implementation=None,
    )
    run_.train()
    checks = [c for c in run_.callback_handler.callbacks if getattr(c, "last_report", None) is not None]
    run.record(
        part="trainer",
        sequence_parallel_size=run.mesh.size,
        max_tokens_per_batch=budget,
        losses=[e["loss"] for e in run_.state.log_history if "loss" in e],
        probe=checks[0].last_report.summary() if checks else None,
    )
    del model, run_
    free()


def main() -> None:
    args = _arguments()
    run = Run(args)
    began = time.perf_counter()
    parts = {"exact": exact, "longest": longest, "throughput": throughput, "trainer": trainer}
    for name in args.parts.split(","):
        parts[name](run)
    print(f"done in {time.perf_counter() - began:.0f} s; {run.out / 'results.json'}", flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
