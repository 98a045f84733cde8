"""One process of the sequence-parallel tests (started by tests/parallel/test_sequence_parallel.py).

    python _sp_worker.py MODE OUT_DIR [key=value ...]

MODE ``blocks``: the building blocks in a custom loop: the whole packed row's loss and gradients on
this rank (no Ulysses) against the sharded run over the group (losses summed, gradients all-reduced).
MODE ``trainer``: PackingTrainer for 3 optimizer steps; writes its losses, grad norms and weights.
Under torch.distributed when WORLD_SIZE is set (gloo), else one process.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _tiny_models
from _tiny_models import random_examples, tiny_model, training_args  # noqa: E402

LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4, 13, 3, 7, 5, 16, 2, 8]


def _options(argv) -> dict:
    out = {}
    for item in argv:
        key, value = item.split("=", 1)
        out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def _reference_varlen(module, query, key, value, attention_mask, scaling=None, sliding_window=None,
                      cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None, **kwargs):
    """A varlen kernel on CPU (reads only cu_seq_lens / max_length, like packing_varlen): the Ulysses varlen path."""
    from _tiny_models import reference_varlen_attn

    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    window = (sliding_window - 1, 0) if sliding_window else (-1, 0)
    out = reference_varlen_attn(q, k, v, cu_seq_lens_q.int(), cu_seq_lens_k.int(), int(max_length_q), int(max_length_k),
                                scale=scaling, window_size=window, enable_gqa=True)
    return out[None], None


def _register_reference_varlen() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register("packing_varlen_cpu_reference", _reference_varlen)
    AttentionMaskInterface.register("packing_varlen_cpu_reference", flash_attention_mask)
    return "packing_varlen_cpu_reference"


def _one_config(mesh, arch: str, kv: int, heads: int = 4, attn: str = "sdpa", fsdp: bool = False) -> dict:
    import torch.distributed as dist

    from packing_collators import FlatteningCollator
    from packing_collators.parallel import enable_ulysses_attention, shard_flat_batch

    if attn == "varlen":
        attn = _register_reference_varlen()
    model = tiny_model(arch, attn=attn, num_attention_heads=heads, num_key_value_heads=kv, hidden_size=8 * heads)
    reference = copy.deepcopy(model)
    batch = FlatteningCollator()(random_examples(LENGTHS[:6], seed=3, completion_only=True))
    whole = reference(**batch)
    whole.loss.backward()
    enable_ulysses_attention(model, mesh.sp_group, mesh.size)
    shard = shard_flat_batch(batch, rank=mesh.sp_rank, size=mesh.size)
    targets = shard["shift_labels"].ne(-100).sum()
    dist.all_reduce(targets)  # the whole row's target count: each shard's loss is its sum / that
    if fsdp:  # FSDP2 over the group: it averages the gradients, the shards' sum is wanted
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh.mesh["sp"])
        fully_shard(model, mesh=mesh.mesh["sp"])
    loss = model(**shard, num_items_in_batch=targets).loss
    (loss * (mesh.size if fsdp else 1)).backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    gradient_gap = 0.0
    for p, q in zip(model.parameters(), reference.parameters()):
        if fsdp:
            grad = p.grad.full_tensor()
        else:
            dist.all_reduce(p.grad)
            grad = p.grad
        gradient_gap = max(gradient_gap, float((grad - q.grad).abs().max()))
    return {"loss": float(total), "reference": float(whole.loss.detach()), "gradient_gap": gradient_gap, "model": model}


def blocks(out: Path, configs: str = "llama:2", leak: str = "no") -> None:
    """Each ``arch:kv_heads[:varlen][:fsdp]`` of ``configs``; with ``leak=yes`` also a wrong mask, run through the probe."""
    import torch.distributed as dist

    from packing_collators.parallel import _ulysses, probe_sequence_parallel, sequence_parallel_mesh

    dist.init_process_group("gloo")
    mesh = sequence_parallel_mesh(dist.get_world_size())
    results = {}
    for config in configs.split(","):
        arch, kv, *extra = config.split(":")
        attn = next((e for e in extra if e != "fsdp"), "sdpa")
        result = _one_config(mesh, arch, int(kv), attn=attn, fsdp="fsdp" in extra)
        model = result.pop("model")
        result["probe"] = probe_sequence_parallel(model, mesh).passed
        results[config] = result
    if leak == "yes":  # a wrong mask, causal over the whole row: examples see each other
        _ulysses._packed_mask = lambda cu, total, window: torch.ones(total, total, dtype=torch.bool).tril()[None, None]
        result = _one_config(mesh, "llama", 2)
        result["probe"] = probe_sequence_parallel(result.pop("model"), mesh).summary()
        results["leak"] = result
    (out / f"blocks_rank{mesh.sp_rank}.json").write_text(json.dumps(results))


def refusals(out: Path) -> None:
    """Three set-ups PackingTrainer(sequence_parallel_size=2) must refuse before the first step."""
    import datasets

    from packing_collators import PackingTrainer

    train = datasets.Dataset.from_list(random_examples(LENGTHS, seed=7))
    args = training_args(out / "run", max_steps=1)
    cases = {
        "heads": dict(model=tiny_model("llama", num_attention_heads=3, num_key_value_heads=1, hidden_size=24), sp=2),
        "world": dict(model=tiny_model("llama", num_attention_heads=6, num_key_value_heads=3, hidden_size=48), sp=3),
        "budget": dict(model=tiny_model("llama"), sp=2, budget=4),
    }
    errors = {}
    for case, options in cases.items():
        try:
            run = PackingTrainer(model=options["model"], args=args, train_dataset=train,
                                 max_tokens_per_batch=options.get("budget", 24),
                                 sequence_parallel_size=options["sp"])
            run.train()
        except ValueError as error:
            errors[case] = str(error)
    (out / f"refusals_rank{args.process_index}.json").write_text(json.dumps(errors))


def trainer(out: Path, sp: int = 1, budget: int = 24, arch: str = "llama", heads: int = 4, kv: int = 2, gc: int = 0) -> None:
    import datasets

    from packing_collators import PackingTrainer

    train = datasets.Dataset.from_list(random_examples(LENGTHS, seed=7, completion_only=True))
    args = training_args(out / "run", max_steps=3, gradient_accumulation_steps=2, max_grad_norm=1e9,
                         gradient_checkpointing=bool(gc))
    model = tiny_model(arch, num_attention_heads=heads, num_key_value_heads=kv, hidden_size=8 * heads)
    evaluation = datasets.Dataset.from_list(random_examples(LENGTHS[:9], seed=8, completion_only=True))
    run = PackingTrainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation, eval_packing="multipack",
                         max_tokens_per_batch=budget, sequence_parallel_size=sp)
    run.train()
    eval_loss = run.evaluate()["eval_loss"]
    logs = [entry for entry in run.state.log_history if "loss" in entry]
    checks = [c for c in run.callback_handler.callbacks if hasattr(c, "last_report")]
    weights = {k: v.detach().double().flatten().tolist() for k, v in run.model.state_dict().items()}
    rank = args.process_index
    (out / f"trainer_sp{sp}_rank{rank}.json").write_text(json.dumps({
        "losses": [e["loss"] for e in logs], "examples_per_step": [e["examples_per_step"] for e in logs],
        "packing_efficiency": [e["packing_efficiency"] for e in logs], "grad_norms": [e["grad_norm"] for e in logs], "weights": weights,
        "steps": run.state.global_step, "eval_loss": eval_loss, "probe": checks[0].last_report.summary() if checks else None,
        "gradient_checkpointing": bool(run.model.is_gradient_checkpointing),
        "chunked_loss": [head is not None for head in run._head_loss.heads.values()],
    }))


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        {"blocks": blocks, "trainer": trainer, "refusals": refusals}[mode](out, **_options(sys.argv[3:]))
    except ValueError as error:  # a refusal: every rank must raise it (none may hang in a collective)
        (out / f"error_rank{os.environ.get('RANK', '0')}.txt").write_text(str(error))
        sys.exit(3)
    import torch.distributed as dist

    if dist.is_initialized():  # a clean exit: a gloo group torn down at interpreter exit can abort
        dist.barrier()
        dist.destroy_process_group()
