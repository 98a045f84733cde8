"""PackingTrainer under real torch.distributed: 2 gloo processes on CPU, started by the test.

Each worker trains a tiny Llama for 2 epochs with gradient accumulation through accelerate
(DDP), counting the micro-batches its collator sees. The test checks that both ranks take
the same number of optimizer steps, that each rank trains on exactly its sampler's batches
(accelerate's shard wrapper did not shard them a second time), that together they cover
every example each epoch, and that DDP kept the weights identical.
"""

from __future__ import annotations

import json

import pytest
from _two_ranks import run_two_ranks

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

WORKER = r"""
import json, sys
sys.path.insert(0, {tests!r})
import torch
import datasets
from transformers import TrainingArguments
from _tiny_models import random_examples, tiny_model
from packing_collators import FlatteningCollator, PackingTrainer

out = sys.argv[1]
lengths = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4, 13, 3, 7, 5, 16, 2, 8]
train = datasets.Dataset.from_list(random_examples(lengths, seed=7))
seen = []

class Counting(FlatteningCollator):
    def __call__(self, features):
        seen.append(sorted(f["input_ids"][0] * 1000 + len(f["input_ids"]) for f in features))
        return super().__call__(features)

args = TrainingArguments(
    output_dir=out + "/run", per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2,
    learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
    disable_tqdm=True, dataloader_pin_memory=False,
)
trainer = PackingTrainer(model=tiny_model("llama"), args=args, train_dataset=train, data_collator=Counting(),
                         max_tokens_per_batch=30)
trainer.train()
sampler = trainer._train_batch_sampler
checksum = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
json.dump({{
    "rank": args.process_index, "world": args.world_size, "global_step": trainer.state.global_step,
    "max_steps": trainer.state.max_steps, "num_replicas": sampler.num_replicas, "sampler_rank": sampler.rank,
    "batches_per_epoch": len(sampler), "seen": seen, "checksum": checksum,
    "keys": sorted(random_examples(lengths, seed=7)[i]["input_ids"][0] * 1000 + n for i, n in enumerate(lengths)),
}}, open(out + f"/rank{{args.process_index}}.json", "w"))
"""


def test_two_gloo_ranks_take_equal_steps_on_their_own_batches(tmp_path):
    run_two_ranks(WORKER, tmp_path, hang="a rank hung (unequal step counts hang DDP's all-reduce)")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert [(r["num_replicas"], r["sampler_rank"]) for r in ranks] == [(2, 0), (2, 1)]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == ranks[0]["max_steps"] > 0
    for r in ranks:  # each rank trained on all of its sampler's batches, 2 epochs: no second sharding
        # PackingCheckCallback collates first: the dataset's first 4 examples (static checks), then the
        # live probe's synthetic batch and its leak-test twin (3 examples each)
        first, probe, leak_twin, *r["seen"] = r["seen"]
        assert (len(first), len(probe), len(leak_twin)) == (4, 3, 3)
        assert len(r["seen"]) == 2 * r["batches_per_epoch"]
    per_epoch = ranks[0]["batches_per_epoch"]
    for epoch in range(2):
        covered = set()
        for r in ranks:
            for batch in r["seen"][epoch * per_epoch : (epoch + 1) * per_epoch]:
                covered.update(batch)
        assert covered == set(ranks[0]["keys"])
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-6)


REFUSE = r"""
import sys
sys.path.insert(0, {tests!r})
import torch.distributed as dist
from packing_collators._rank_agreement import refuse_together

dist.init_process_group("gloo")
rank = dist.get_rank()

def check():
    if rank == 1:
        raise ValueError("packing probe FAILED on this rank")

try:
    refuse_together(check, "cpu", "PackingTrainer")
    found = "passed"
except ValueError as error:
    found = str(error)
refuse_together(lambda: None, "cpu", "PackingTrainer")  # a check every rank passes: no error, no hang
open(sys.argv[1] + f"/rank{{rank}}.txt", "w").write(found)
"""


def test_a_refusal_on_one_rank_is_raised_on_every_rank_before_the_first_step(tmp_path):
    # the other rank went on into the first step and waited in its collectives: gloo "connection closed by peer"
    run_two_ranks(REFUSE, tmp_path, timeout=120)
    zero, one = ((tmp_path / f"rank{r}.txt").read_text() for r in range(2))
    assert one == "packing probe FAILED on this rank"
    assert zero.startswith("PackingTrainer: rank 1 of this job refused the set-up before the first step")
