"""MultipackBatchSampler under real torch.distributed: 2 and 3 gloo processes on CPU.

Each test starts its own worker processes (a file store, so no port can be taken). The
workers take num_replicas/rank from torch.distributed, run an all_reduce at every step
(an unequal batch count would hang it, so the store's timeout fails the test), and write
what they yielded; the test checks coverage, budget, equal counts, determinism (against
this process's own plan) and resume. Another worker gives rank 1 a different dataset or
seed: every rank must refuse it at construction, naming rank 1, instead of hanging later.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from packing_collators import MultipackBatchSampler

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

BUDGET = 1000
NUM_EXAMPLES = 997
RESUME_AT = 3

WORKER = rf"""
import datetime, json, sys
import numpy as np
import torch
import torch.distributed as dist
from packing_collators import MultipackBatchSampler

rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=30))
lengths = np.random.default_rng(123).integers(1, 300, {NUM_EXAMPLES})
results = {{}}
for name, options in {{"pad": {{}}, "drop_last": {{"drop_last": True}}}}.items():
    sampler = MultipackBatchSampler(lengths, {BUDGET}, **options)
    assert (sampler.num_replicas, sampler.rank) == (world, rank)
    epochs = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = []
        for batch in sampler:
            batches.append(batch)
            step = torch.tensor([1])
            dist.all_reduce(step)  # hangs (then times out) if the ranks' batch counts differ
            assert step.item() == world
        epochs.append({{"batches": batches, "len": len(sampler), "stats": sampler.stats()}})
    results[name] = epochs

# resume: rank 0's state, taken mid-epoch, resumes every rank
sampler = MultipackBatchSampler(lengths, {BUDGET})
sampler.set_epoch(3)
full = list(sampler)
batches = iter(sampler)
head = [next(batches) for _ in range({RESUME_AT})]
state = [sampler.state_dict()]
dist.broadcast_object_list(state, src=0)
resumed = MultipackBatchSampler(lengths, {BUDGET})
resumed.load_state_dict(state[0])
resumed.set_epoch(3)
remaining = len(resumed)
results["resume"] = {{"full": full, "head": head, "tail": list(resumed), "len": remaining}}
dist.barrier()
dist.destroy_process_group()
with open(out, "w") as f:
    json.dump(results, f)
"""


def run_workers(world: int, tmp_path: Path, worker: str = WORKER, timeout: int = 90) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(worker)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    if "lo" in {name for _, name in socket.if_nameindex()}:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = []
    for rank in range(world):
        out = tmp_path / f"rank{rank}.json"
        args = [sys.executable, str(script), str(rank), str(world), str(tmp_path / "store"), str(out)]
        # a different hash seed per process: the plan must not depend on it
        procs.append(
            subprocess.Popen(args, env={**env, "PYTHONHASHSEED": str(rank + 11)}, stderr=subprocess.PIPE, text=True)
        )
    errors = []
    for rank, proc in enumerate(procs):
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail(f"rank {rank} of {world} did not finish in {timeout} s (a hang in a collective?)")
        if proc.returncode:
            errors.append(f"rank {rank} exited with {proc.returncode}:\n{stderr[-3000:]}")
    assert not errors, "\n".join(errors)
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def world_results(request, tmp_path_factory):
    world = request.param
    return world, run_workers(world, tmp_path_factory.mktemp(f"gloo{world}"))


def lengths() -> np.ndarray:
    return np.random.default_rng(123).integers(1, 300, NUM_EXAMPLES)


def test_every_rank_gets_the_same_number_of_batches(world_results):
    world, results = world_results
    for name in ("pad", "drop_last"):
        for epoch in (0, 1):
            counts = {len(r[name][epoch]["batches"]) for r in results}
            lens = {r[name][epoch]["len"] for r in results}
            assert len(counts) == 1 and counts == lens


def test_the_ranks_cover_the_epoch_exactly_once_and_stay_in_budget(world_results):
    world, results = world_results
    sizes = lengths()
    for epoch in (0, 1):
        batches = [b for r in results for b in r["pad"][epoch]["batches"]]
        counts = Counter(i for b in batches for i in b)
        assert set(counts) == set(range(NUM_EXAMPLES))
        assert sum(counts.values()) - NUM_EXAMPLES == results[0]["pad"][epoch]["stats"]["repeated_examples"]
        assert max(sizes[b].sum() for b in batches) <= BUDGET
        dropped = [b for r in results for b in r["drop_last"][epoch]["batches"]]
        counts = Counter(i for b in dropped for i in b)
        assert max(counts.values()) == 1
        assert NUM_EXAMPLES - len(counts) == results[0]["drop_last"][epoch]["stats"]["drop_last_examples"]


def test_the_plan_is_the_same_in_every_process(world_results):
    world, results = world_results
    for rank, result in enumerate(results):
        here = MultipackBatchSampler(lengths(), BUDGET, num_replicas=world, rank=rank)
        for epoch in (0, 1):
            here.set_epoch(epoch)
            assert result["pad"][epoch]["batches"] == list(here)
            assert result["pad"][epoch]["stats"] == results[0]["pad"][epoch]["stats"]


def test_set_epoch_gives_another_order(world_results):
    world, results = world_results
    for result in results:
        assert result["pad"][0]["batches"] != result["pad"][1]["batches"]


def test_resume_from_a_mid_epoch_state_yields_exactly_the_remaining_batches(world_results):
    world, results = world_results
    for result in results:
        resume = result["resume"]
        assert resume["head"] == resume["full"][:RESUME_AT]
        assert resume["tail"] == resume["full"][RESUME_AT:]
        assert resume["len"] == len(resume["full"]) - RESUME_AT


# Each case builds a sampler on both ranks; rank 1's dataset or seed may differ from rank 0's.
MISMATCH_WORKER = r"""
import datetime, json, sys
import numpy as np
import torch
import torch.distributed as dist
from packing_collators import MultipackBatchSampler

rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=20))
full = np.random.default_rng(5).integers(1, 300, 1200)
shard = full[:1000] if rank == 1 else full  # rank 1 reads a shard, as if the dataset were split by rank
cases = {
    "dataset": (shard, {}),
    "order": (full[::-1].copy() if rank == 1 else full, {}),  # same examples and tokens, another order
    "seed": (full, {"seed": rank}),
    "explicit_ranks": (shard, {"num_replicas": world, "rank": rank}),  # as PackingTrainer passes them
    "other_world": (shard, {"num_replicas": world + 1, "rank": rank}),  # not this process group's ranks
    "agree": (full, {}),
}
results = {}
for name, (lengths, options) in cases.items():
    try:
        sampler = MultipackBatchSampler(lengths, 1000, **options)
    except ValueError as error:
        results[name] = {"error": str(error)}
        continue
    steps = 0
    if name == "agree":
        for batch in sampler:
            step = torch.tensor([1])
            dist.all_reduce(step)  # hangs (then times out) if the ranks' batch counts differ
            steps += 1
    results[name] = {"steps": steps, "len": len(sampler)}
dist.barrier()
dist.destroy_process_group()
with open(out, "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def mismatch_results(tmp_path_factory):
    return run_workers(2, tmp_path_factory.mktemp("mismatch"), MISMATCH_WORKER, timeout=60)


def errors_of(results: list[dict], case: str) -> list[str]:
    """Each rank's ValueError message for ``case``; every rank must have raised one."""
    for rank, result in enumerate(results):
        assert "error" in result[case], f"rank {rank} built the {case!r} sampler without an error: {result[case]}"
    return [result[case]["error"] for result in results]


def test_every_rank_refuses_a_rank_with_another_dataset(mismatch_results):
    full = np.random.default_rng(5).integers(1, 300, 1200)
    expected = (
        f"rank 1 has 1,000 examples ({int(full[:1000].sum()):,} tokens), rank 0 has 1,200 ({int(full.sum()):,} tokens)"
    )
    for case in ("dataset", "explicit_ranks"):
        errors = errors_of(mismatch_results, case)
        assert errors[0] == errors[1]  # every rank raises the same error
        for error in errors:
            assert expected in error
            assert "every rank must build the sampler from the same dataset" in error
            assert "do not shard the dataset by rank" in error


def test_every_rank_refuses_a_rank_with_other_lengths_or_settings(mismatch_results):
    for error in errors_of(mismatch_results, "order"):
        assert re.search(r"rank 1 has the same 1,200 examples and [\d,]+ tokens as rank 0 but different lengths", error)
    for error in errors_of(mismatch_results, "seed"):
        assert "rank 1 has seed=1, rank 0 has seed=0" in error
        assert "pass the same seed on every rank" in error
        assert "same dataset" not in error


def test_ranks_that_agree_build_and_iterate(mismatch_results):
    agree = [result["agree"] for result in mismatch_results]
    assert "error" not in agree[0] and "error" not in agree[1]
    assert agree[0]["steps"] == agree[1]["steps"] == agree[0]["len"] > 0


def test_ranks_of_another_world_size_are_not_checked(mismatch_results):
    for result in mismatch_results:
        assert "error" not in result["other_world"]
