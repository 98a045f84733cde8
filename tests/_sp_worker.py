"""One process of the sequence-parallel tests (started by tests/test_sequence_parallel.py).

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tiny_models import random_examples, tiny_model, training_args  # noqa: E402

LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4, 13, 3, 7, 5, 16, 2, 8]


def _options(argv) -> dict:
    out = {}
    for item in argv:
        key, value = item.split("=", 1)
        out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def blocks(out: Path, arch: str = "llama", kv: int = 2, heads: int = 4, leak: str = "no") -> None:
    import torch.distributed as dist

    from packing_collators import FlatteningCollator
    from packing_collators.parallel import enable_ulysses_attention, sequence_parallel_mesh, shard_flat_batch

    dist.init_process_group("gloo")
    mesh = sequence_parallel_mesh(dist.get_world_size())
    model = tiny_model(arch, num_attention_heads=heads, num_key_value_heads=kv, hidden_size=8 * heads)
    reference = copy.deepcopy(model)
    batch = FlatteningCollator()(random_examples(LENGTHS[:6], seed=3, completion_only=True))
    whole = reference(**batch)
    whole.loss.backward()
    enable_ulysses_attention(model, mesh.sp_group, mesh.size)
    if leak == "yes":  # a wrong mask: causal over the whole row, examples see each other
        from packing_collators.parallel import _ulysses

        _ulysses._packed_mask = lambda cu, total, window: torch.ones(total, total, dtype=torch.bool).tril()[None, None]
    shard = shard_flat_batch(batch, rank=mesh.sp_rank, size=mesh.size)
    targets = shard["shift_labels"].ne(-100).sum()
    dist.all_reduce(targets)
    loss = model(**shard, num_items_in_batch=targets).loss
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    gradient_gap = 0.0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        dist.all_reduce(p.grad)
        gradient_gap = max(gradient_gap, float((p.grad - q.grad).abs().max()))
    result = {"loss": float(total), "reference": float(whole.loss), "gradient_gap": gradient_gap}
    if leak == "yes":
        from packing_collators.parallel import probe_sequence_parallel

        result["probe"] = probe_sequence_parallel(model, mesh).summary()
    (out / f"blocks{mesh.sp_rank}.json").write_text(json.dumps(result))


def trainer(out: Path, sp: int = 1, budget: int = 24, arch: str = "llama", heads: int = 4, kv: int = 2) -> None:
    import datasets

    from packing_collators import PackingTrainer

    train = datasets.Dataset.from_list(random_examples(LENGTHS, seed=7, completion_only=True))
    args = training_args(out / "run", max_steps=3, gradient_accumulation_steps=2, max_grad_norm=1e9)
    model = tiny_model(arch, num_attention_heads=heads, num_key_value_heads=kv, hidden_size=8 * heads)
    run = PackingTrainer(model=model, args=args, train_dataset=train, max_tokens_per_batch=budget,
                         sequence_parallel_size=sp)
    run.train()
    logs = [entry for entry in run.state.log_history if "loss" in entry]
    weights = {k: v.detach().double().flatten().tolist() for k, v in run.model.state_dict().items()}
    rank = args.process_index
    (out / f"trainer_sp{sp}_rank{rank}.json").write_text(json.dumps({
        "losses": [e["loss"] for e in logs], "grad_norms": [e["grad_norm"] for e in logs], "weights": weights,
        "steps": run.state.global_step,
    }))


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    {"blocks": blocks, "trainer": trainer}[mode](out, **_options(sys.argv[3:]))
