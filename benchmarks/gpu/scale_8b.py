"""Llama-3.1-8B on 8,192-token packed rows, FSDP2 over 1, 2 and 4 GPUs, beside torchtitan on the same GPUs (#46).

One run (one torchrun) trains a fresh Llama-3.1-8B-shaped model (hidden 4096, 32 layers, 32/8 heads, MLP 14336,
vocabulary 128,256; random weights, seeded, bf16 weights, gradients and AdamW states) on the documents of
``_scale_8b_data.py`` (``long_tail`` lengths, up to 8,192 tokens, mean ~420):

    MultipackBatchSampler(lengths, 8192, num_replicas=R)   R sampler ranks ("--replicas", default the GPUs)
        -> FlatteningCollator: one flat row <= 8,192 tokens per micro-batch, cu_seq_lens for FA4 (packing_fa4)
        -> the loss a chunk of tokens at a time (packing_collators.loss.training_loss, no 8192 x 128256 logits)
    model:  each decoder layer checkpointed (full activation checkpointing, torchtitan's checkpoint_wrapper),
            [--compile: each layer torch.compile'd, rows padded to 8,192], then FSDP2 as torchtitan shards:
            embedding, each layer, [final norm + head] (kept unsharded after forward), the root;
            MixedPrecisionPolicy(bf16 params, fp32 gradient reduction); AdamW(fused), clip 1.0
    step:   the R sampler ranks' micro-batches of the step; a process on G GPUs trains ranks r = g, g+G, ...
            one after another (gradient accumulation, reduce-scatter on the last only): 2 GPUs with R = 4
            train exactly the 4-GPU run's steps, so their losses are its replay, and 1 GPU replays it too.
            loss = sum(cross-entropy) / the step's targets over all R ranks (torchtitan's normalisation)

Tokens/s per GPU = real tokens of the timed steps over all ranks / the timed seconds / GPUs. MFU as torchtitan
counts it, and per the causal documents: ``_scale_8b_metrics.py`` (peak 989 TFLOP/s, H100 SXM bf16 dense).
Writes ``<out>/<name>.json`` (rank 0). ``--runner trainer``: the same rows through ``PackingTrainer`` (G = R).

Device plan (issue #46): ONE call on a 4x H100 machine, <= 9.5 min, after FA4's first call
(``bash ../shared/gpu/fa4-wheels.sh`` and ``bash benchmarks/gpu/torchtitan_wheels.sh`` here first):

    call 1, carry [".fa4a"]:          mkdir -p /tmp/fa4 && cp .fa4a/* /tmp/fa4/
    call 2, carry [".fa4b", ".ttwhl"], at once (timeout_s 600):
        source .fa4b/install.sh || echo "no FA4: our runs take packing_varlen"; python3 -m pip install -q \\
        --no-index --no-deps --no-compile --target /tmp/tt .ttwhl/*.whl && export PYTHONPATH=/tmp/tt:$PYTHONPATH \\
        PYTHONUNBUFFERED=1 && python3 benchmarks/gpu/scale_8b.py --plan --out $OUT --deadline-s 510
    (a call carries 64 MiB with the tree (9 MB): where .fa4a and the tree pass it, move .fa4a's three largest
    wheels after cu13part.aa to a .fa4c/ carried in call 2 and ``cp .fa4c/* /tmp/fa4/`` before the source)

``--plan`` (``_scale_8b_plan.py``) runs, each under ``timeout``, skipped when the deadline leaves too little:

    step            what                                                     expected
    env             versions, nvidia-smi                                                   ~5 s
    titan_causal_4  torchtitan 0.2.2 Llama 3.1 8B, 4 GPUs, FSDP, full AC, bf16, local batch 1 x 8192, 15 steps,
                    flavour 8B: sdpa, one causal sequence per row (its published setting; unpacked rows)  ~80 s
    ours_4          ours, 4 GPUs, the same settings, 3 + 12 steps                                          ~100 s
    ours_2          ours, 2 GPUs, R = 4 (2 micro-batches a step): scaling, and the replay of ours_4     ~70 s
    titan_varlen_4  torchtitan, 4 GPUs, flavour 8B_varlen: its varlen attention over the same documents  ~90 s
    ours_1          ours, 1 GPU, R = 4 (4 micro-batches a step; bf16 AdamW states: ~64 GB + activations)   ~70 s
    titan030_import torchtitan 0.3.0's import on the image's torch 2.11 (fails: torchtitan_wheels.sh)  ~20 s
    (if time)       ours_4_compile, titan_varlen_4_compile (torch.compile on both), ours_trainer_4       ~150 s each
    (2 GPUs)        ours_1_r2_lb2, ours_2_r2_lb2[_keep|_bf16_reduce|...]: the 2-rank plan, one FSDP2 option at a
                    time against the 1-GPU replay, step 2 profiled (``--profile-step``, ``_step_profile.py``);
                    ours_trainer_{1,2,4}_lb2; the same compiled (*_compile[_dynamic|_layers]: ``--compile-as``)
    (4 GPUs, lb2)   ours_4_keep_compile_lb2 beside titan_varlen_4_keep_compile_lb2 (torchtitan's setting exactly);
                    ours_4_torch_norm_lb2: eager on torchtitan's RMSNorm kernel (``--rms-norm torch``, _fused_norm.py)

and writes, after every step, at most 4 files: ``results.json`` (the rows of issue #46's item 5 and every run),
``report.md`` (the table for docs/benchmarks.md), ``runs.log`` (every run's output), ``env.txt``. Each of our runs pays FA4's warm-up (~25 s of kernel compiles) unless ``--fa4-disk-cache`` shares FA4's on-disk
cache (the runs after the first then compile none: benchmarks/results/scale_8b_h200x2_diag/). ours_1 runs with
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.

CPU checks: ``--smoke`` (tiny shapes, gloo, sdpa, float32; tests/test_scale_8b_harness.py runs it as 2 ranks against
its 1-process replay); ``--plan --smoke --out DIR`` rehearses the whole device call on the CPU (2 gloo processes,
torchtitan's debug model under DDP; needs torchtitan 0.2.2's wheels installed, as on the device); ``--report DIR``
rebuilds results.json and report.md from a results.json's runs.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the _scale_8b_* helpers, benchmarks/_shared
from _scale_8b_data import documents, step_imbalance, targets  # noqa: E402
from _scale_8b_metrics import H100_BF16_PEAK, LLAMA_3_1_8B, TINY, flops_per_token, flops_row, mfu  # noqa: E402
from _scale_8b_metrics import causal_document_flops_per_token  # noqa: E402
from _shared import CompileCounter, gather_ranks, model_config  # noqa: E402
from _step_profile import PROFILE_SPLIT, start_profile, stop_profile  # noqa: E402

SHAPES = {"8b": LLAMA_3_1_8B, "tiny": TINY}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip


# ----------------------------------------------------------------------------- the model
def build_model(args, device: torch.device, dtype: torch.dtype):
    """Llama of ``args.shape`` with random weights drawn on ``device`` in ``dtype`` (seeded: the same weights on every
    rank and every GPU count), ``args.attn`` attention."""
    from transformers import LlamaForCausalLM

    shape = SHAPES[args.shape]
    dims = (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.intermediate)
    config = model_config(dims, shape.vocab, max_position_embeddings=131072, rms_norm_eps=1e-5,
                          rope_parameters=dict(LLAMA3_ROPE))  # fmt: skip
    torch.manual_seed(args.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # no float32 copy of 8B parameters on the way
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    if args.attn == "packing_fa4":
        from packing_collators import register_fa4_attention

        register_fa4_attention()
    model.config._attn_implementation = args.attn
    if args.rms_norm == "torch":  # torch's fused kernel, torchtitan's norm (_fused_norm.py); else transformers' own
        from _fused_norm import torch_rms_norm

        if not torch_rms_norm(model):  # refuse rather than time transformers' norm under the fused one's name
            raise SystemExit(f"--rms-norm torch: {type(model).__name__} has no RMSNorm with variance_epsilon to swap")
    return model.train()


def wrap(model, args, world: int, device: torch.device, dtype: torch.dtype):
    """Full activation checkpointing per layer, optional per-layer compile, then FSDP2 as torchtitan applies it."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers, how = model.model.layers, args.compile and args.compile_as
    for index in range(len(layers)):
        layer = layers[index]
        if args.ac == "full" and how != "layers":
            layer = checkpoint_wrapper(layer, preserve_rng_state=False)
        if how in ("module", "module_dynamic"):  # the row length static (one bucket), or symbolic as the Trainer's
            layer = torch.compile(layer, backend=args.compile_backend, dynamic=True if how == "module_dynamic" else None)
        layers[index] = layer
    if how == "layers":  # PackingTrainer's way: each layer's forward compiled, dynamic shapes, the checkpoint inside
        from packing_collators.models import compile_layers

        compile_layers(model, backend=args.compile_backend, checkpoint=args.ac == "full")
    if world == 1:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    reduce_dtype = getattr(torch, args.reduce_dtype)  # float32: torchtitan's default (mixed_precision_reduce)
    options = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype))
    reshard = args.reshard_after_forward == "always"  # never: no second all-gather for the recompute and backward
    fully_shard(model.model.embed_tokens, reshard_after_forward=reshard, **options)
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard, **options)
    fully_shard([model.model.norm, model.lm_head], reshard_after_forward=False, **options)  # prefetched at once
    fully_shard(model, **options)
    if args.prefetch:  # explicit: each layer starts the next ``prefetch`` layers' all-gathers (FSDP2 implies 1)
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(list(layers[i + 1 : i + 1 + args.prefetch]))
            layer.set_modules_to_backward_prefetch(list(layers[max(0, i - args.prefetch) : i])[::-1])
    return model


# ----------------------------------------------------------------------------- the plan of micro-batches
def step_plan(lengths: np.ndarray, args) -> tuple[list[list[list[int]]], dict]:
    """(plan[r][step]: the example indices of sampler rank r's micro-batch at ``step`` in an R-rank multipack epoch,
    the sampler's statistics: efficiency, imbalance across the ranks)."""
    from packing_collators import MultipackBatchSampler

    samplers = [
        MultipackBatchSampler(
            lengths, args.tokens_per_batch, num_replicas=args.replicas, rank=r, seed=args.seed, check_ranks=False
        )
        for r in range(args.replicas)
    ]
    plan = [list(sampler) for sampler in samplers]
    if len(plan[0]) < args.warmup + args.steps:
        raise SystemExit(
            f"{args.examples} documents make {len(plan[0])} steps of {args.replicas} x {args.tokens_per_batch} tokens, "
            f"fewer than --warmup + --steps = {args.warmup + args.steps}: raise --examples"
        )
    stats = {k: v if isinstance(v, (int, str)) else float(v) for k, v in samplers[0].stats().items()}
    return plan, stats


# ----------------------------------------------------------------------------- the runners
def run_loop(args, rank: int, world: int, device: torch.device) -> dict | None:
    from packing_collators import FlatteningCollator, warm_up_attention
    from packing_collators.loss import training_loss

    cuda, dtype = device.type == "cuda", torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = SHAPES[args.shape]
    lengths, docs = documents(args.distribution, args.examples, args.max_length, shape.vocab, args.seed)
    plan, sampler_stats = step_plan(lengths, args)
    mine = [r for r in range(args.replicas) if r % world == rank]  # the sampler ranks this process trains
    started = time.perf_counter()
    model = wrap(build_model(args, device, dtype), args, world, device, dtype)
    init_seconds = time.perf_counter() - started
    # before any forward: a forward leaves [norm, head] unsharded (reshard_after_forward=False), and an optimizer
    # built then would hold the unsharded tensors and never update the sharded ones
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  **({"fused": True} if cuda else {}))  # fmt: skip
    bucket = [args.tokens_per_batch] if args.compile else None  # compiled: one row length, one graph
    collate = FlatteningCollator(pad_to_buckets=bucket)
    from packing_collators.models._compile_layers import graphs_compiled

    fa4 = CompileCounter()  # FA4's compiled kernels (0 where flash_attn.cute is not installed)
    started = time.perf_counter()
    if args.attn == "packing_fa4":  # FA4 compiles a kernel per kind of batch: all of them before the timed steps
        warm_up_attention(model, max_length=args.max_length)
    if args.compile:
        from packing_collators.trainer._compile import warm_up_compiled

        def forward_backward(batch, model=model):
            model(**to_device(batch, device)).loss.backward()

        warm_up_compiled(forward_backward, collate, tuple(bucket), vocab=shape.vocab)
        model.zero_grad(set_to_none=True)
    loss_fn = training_loss(model, "chunked")  # raises rather than fall back to the full logits
    warm_up_seconds, warm_up_kernels, warm_up_graphs = time.perf_counter() - started, fa4.count, graphs_compiled()
    if rank == 0:
        print(f"init {init_seconds:.1f} s, warm-up {warm_up_seconds:.1f} s ({warm_up_kernels} FA4 kernels)", flush=True)
    if cuda:
        torch.cuda.empty_cache()  # the warm-up's full-logit losses leave large blocks behind (1 GPU: tight)
        torch.cuda.reset_peak_memory_stats(device)
    losses, norms, ends, tokens, documents_trained = [], [], [], 0, []
    gc.collect()
    gc.disable()  # no collector pauses inside the timed steps (torchtitan collects every 50 steps itself)
    sync(device)
    ends.append(time.perf_counter())
    profile = None
    for step in range(args.warmup + args.steps):
        profiler = start_profile(cuda) if args.profile_step == step + 1 else None
        step_targets = sum(targets(lengths, plan[r][step]) for r in range(args.replicas))
        total = torch.zeros((), device=device)
        for position, r in enumerate(mine):
            indices = plan[r][step]
            batch = to_device(collate([{"input_ids": docs[i]} for i in indices]), device)
            if world > 1:  # reduce-scatter gradients on the process's last micro-batch only
                model.set_requires_gradient_sync(position == len(mine) - 1)
            share = targets(lengths, indices) / step_targets
            loss = loss_fn(batch) * share  # this micro-batch's cross-entropy sum / the step's targets
            (loss * world).backward()  # FSDP averages over the GPUs: the sum over all micro-batches
            total += loss.detach()
            if step >= args.warmup:
                tokens += int(lengths[indices].sum())
        if step >= args.warmup:
            documents_trained += [int(lengths[i]) for r in range(args.replicas) for i in plan[r][step]]
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=cuda)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if world > 1:
            dist.all_reduce(total)
        losses.append(float(total))  # waits for the step, as torchtitan's per-step log line does
        norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
        if profiler is not None:  # the export counts in this step's seconds: profile an untimed step
            profile = stop_profile(profiler, args, rank, time.perf_counter() - ends[-1])
            if world > 1:  # the ranks' exports take different times: start the next step together, else the
                dist.barrier()  # first to finish counts the others' export in its next step (and the rate takes it)
        ends.append(time.perf_counter())
        if rank == 0:
            print(f"step {step + 1}: loss {losses[-1]:.5f}  {ends[-1] - ends[-2]:.3f} s", flush=True)
    gc.enable()
    seconds = ends[-1] - ends[args.warmup]
    peak = (
        [torch.cuda.max_memory_allocated(device) / 2**30, torch.cuda.max_memory_reserved(device) / 2**30]
        if cuda
        else [0, 0]
    )
    gathered = gather_ranks([tokens, seconds, *peak], world, device)
    profiles = None
    if profile is not None:  # every rank's split: communication waits on the slowest rank, so they differ
        numbers = gather_ranks([profile[k] for k in PROFILE_SPLIT], world, device)
        profiles = [{k: round(float(v), 3) for k, v in zip(PROFILE_SPLIT, g)} for g in numbers]
    del loss_fn, optimizer, model  # FSDP's modules hold the process group: gone before it is (a crash at exit else)
    gc.collect()
    if rank != 0:
        return None
    all_tokens = sum(float(g[0]) for g in gathered)
    rate = all_tokens / max(float(g[1]) for g in gathered) / world
    flops, flops_documents = (
        flops_per_token(shape, flops_row(args)),
        causal_document_flops_per_token(shape, documents_trained),
    )
    return {
        "name": args.name,
        "runner": "loop",
        "gpus": world,
        "replicas": args.replicas,
        "micro_batches_per_step_per_gpu": len(mine),
        "card": torch.cuda.get_device_name(device) if cuda else "cpu",
        "versions": versions(),
        "shape": args.shape,
        "attention": args.attn,
        "activation_checkpointing": args.ac,
        "compile": bool(args.compile),
        "compile_as": args.compile_as if args.compile else None,
        "dtype": str(dtype).removeprefix("torch."),
        "tokens_per_batch": args.tokens_per_batch,
        "distribution": args.distribution,
        "steps": args.steps,
        "warmup": args.warmup,
        "tokens_per_s_per_gpu": rate,
        "flops_per_token": flops,
        "flops_per_token_causal_documents": flops_documents,
        "mfu": mfu(flops, rate),
        "mfu_causal_documents": mfu(flops_documents, rate),
        "peak_flops": H100_BF16_PEAK,
        "step_seconds": np.diff(ends).round(4).tolist(),
        "median_step_s": float(np.median(np.diff(ends)[args.warmup :])),
        "fill": all_tokens / (args.steps * args.replicas * args.tokens_per_batch),  # real tokens / budgets
        "step_token_imbalance": step_imbalance(lengths, plan, range(args.warmup, args.warmup + args.steps)),
        "sampler_stats": sampler_stats,
        "loss": losses,
        "grad_norm": norms,
        "peak_allocated_gib_per_gpu": [round(float(g[2]), 2) for g in gathered],
        "peak_reserved_gib_per_gpu": [round(float(g[3]), 2) for g in gathered],
        "init_seconds": round(init_seconds, 2),
        "warm_up_seconds": round(warm_up_seconds, 2),
        "fa4_kernels": {
            "warm_up": warm_up_kernels,
            "after_warm_up": fa4.count - warm_up_kernels,
            "compile_seconds": round(fa4.seconds, 1),
        },
        "dynamo_graphs": {"warm_up": warm_up_graphs, "after_warm_up": graphs_compiled() - warm_up_graphs},
        "reduce_dtype": args.reduce_dtype,
        "reshard_after_forward": args.reshard_after_forward,
        "prefetch": args.prefetch,
        "rms_norm": args.rms_norm,
        "nccl_max_ctas": os.environ.get("NCCL_MAX_CTAS"),
        "profile": profile,
        "profile_ranks": profiles,
        "command": f"torchrun --nproc-per-node {world} " + " ".join(sys.argv),
    }


# ----------------------------------------------------------------------------- plumbing
def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def versions() -> dict:
    import importlib.metadata

    out = {"torch": torch.__version__}
    for name in ("transformers", "accelerate", "flash-attn-4", "nvidia-cutlass-dsl", "packing-collators"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--runner", choices=("loop", "trainer"), default="loop")
    add("--name", default="ours")
    add("--out", type=Path, help="folder for <name>.json (--plan: $OUT)")
    add("--shape", choices=sorted(SHAPES), default="8b")
    add("--distribution", default="long_tail")
    add("--max-length", type=int, default=8192, help="longest document")
    add("--examples", type=int, default=3000, help="documents drawn (enough for --warmup + --steps)")
    add("--tokens-per-batch", type=int, default=8192, help="multipack budget: one flat row per micro-batch")
    add("--replicas", type=int, default=None, help="sampler ranks (default: the GPUs); more replays them")
    add("--steps", type=int, default=12, help="timed optimizer steps")
    add("--warmup", type=int, default=3, help="untimed steps first")
    add("--lr", type=float, default=1e-4)
    add("--seed", type=int, default=0)
    add("--ac", choices=("full", "none"), default="full", help="activation checkpointing")
    add("--compile", action="store_true", help="torch.compile each decoder layer (rows padded to the budget)")
    add("--compile-backend", default="inductor")
    add("--compile-as", choices=("module", "module_dynamic", "layers"), default="module",
        help="--compile: torch.compile of each checkpointed layer (row length static; _dynamic: symbolic), or layers: "
             "compile_layers(checkpoint=True), PackingTrainer's way (symbolic, the checkpoint inside the graph)")
    add("--compile-layers", choices=("auto", "true", "false"), default="auto",
        help="--runner trainer: PackingTrainer's compile_layers (auto: compiled on a GPU, under FSDP2 too)")
    add("--reshard-after-forward", choices=("always", "never"), default="always",
        help="FSDP2 for the embeddings and layers (torchtitan's fsdp_reshard_after_forward): never keeps each layer's "
             "gathered bf16 parameters from its forward to its backward (+16 GB at 8B), one all-gather a step fewer")
    add("--reduce-dtype", choices=("float32", "bfloat16"), default="float32",
        help="FSDP2's gradient reduce-scatter dtype (torchtitan's mixed_precision_reduce; bfloat16 halves its bytes)")
    add("--rms-norm", choices=("model", "torch"), default="model", help="torch: torch's fused RMSNorm kernel")
    add("--prefetch", type=int, default=0, help="explicit FSDP2 all-gather prefetch, in layers (0: FSDP2's own)")
    add("--profile-step", type=int, default=None,
        help="profile this step (1-based): <out>/<name>_trace.json.gz and the record's 'profile' (_trace_overlap.py)")
    add("--attn", default=None, help="attention (default packing_fa4 on CUDA, sdpa on the CPU)")
    add("--smoke", action="store_true", help="tiny shapes, float32, gloo, sdpa (the CPU check)")
    add("--plan", action="store_true", help="run the device plan (_scale_8b_plan.py) into --out")
    add("--deadline-s", type=float, default=510, help="--plan: start no step that cannot end by then")
    add("--fa4-disk-cache", action="store_true", help="--plan: FA4's on-disk kernel cache, shared by our runs")
    add("--only", help="--plan: the steps to run, by name, comma-separated, in that order (default: all, the plan's)")
    add("--report", type=Path, help="rebuild results.json and report.md from the runs in this folder")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.max_length, args.examples, args.tokens_per_batch = "tiny", 512, 400, 1024
        args.steps, args.warmup, args.compile_backend = min(args.steps, 3), min(args.warmup, 1), "aot_eager"
        args.profile_step = args.profile_step and min(args.profile_step, args.warmup)  # still an untimed step
    args.attn = args.attn or ("sdpa" if args.smoke or not torch.cuda.is_available() else "packing_fa4")
    return args


def main() -> None:
    args = parse_args()
    if args.plan or args.report:
        import _scale_8b_plan

        return _scale_8b_plan.main(args)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    args.replicas = args.replicas or world
    if args.replicas % world:
        raise SystemExit(f"--replicas {args.replicas} must be a multiple of the {world} processes")
    if args.runner == "trainer" and args.replicas != world:
        raise SystemExit("--runner trainer trains --replicas = the GPUs (its sampler plans for the processes it sees)")
    if args.prefetch < 0:
        raise SystemExit(f"--prefetch {args.prefetch}: give 0 (FSDP2's own prefetch) or a number of layers")
    if args.profile_step is not None and not 1 <= args.profile_step <= args.warmup:
        raise SystemExit(f"--profile-step {args.profile_step}: profile one of the {args.warmup} untimed steps "
                         "(1..--warmup); a profiled step's trace export would count in the rate")
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))  # fmt: skip
    try:
        if args.runner == "loop":
            out = run_loop(args, rank, world, device)
        else:
            from _scale_8b_trainer import run_trainer

            dtype = torch.bfloat16 if cuda else torch.float32
            build = lambda: build_model(args, device, dtype)  # noqa: E731 (no reference to the model kept here)
            out = run_trainer(args, rank, world, device, build, SHAPES[args.shape], versions())
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if out is not None and args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(out, indent=1))
        print(json.dumps({k: v for k, v in out.items() if k not in ("loss", "grad_norm", "step_seconds")}), flush=True)


if __name__ == "__main__":
    main()
