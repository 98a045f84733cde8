"""The chunked loss under FSDP2 on 2 gloo ranks: each rank's gradients are those of the full-logit loss, averaged.

FSDP2 unshards the head's weight for the head's call (the root's or its own unit's), where the chunked
loss reads it, and reduce-scatters the gradients it returns like any other; the reference is one
process computing each rank's full-logit loss and averaging the gradients.
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import random_examples, tiny_model
from _two_ranks import run_two_ranks

from packing_collators import FlatteningCollator

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

WORKER = r"""
import sys
sys.path.insert(0, {tests!r})
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from _tiny_models import random_examples, tiny_model
from packing_collators import FlatteningCollator
from packing_collators.batch import shifted_targets
from packing_collators.loss import chunked_forward, output_head

dist.init_process_group("gloo")
rank, own_head = dist.get_rank(), sys.argv[2] == "own_head"
model = tiny_model("llama")
for layer in model.model.layers:
    fully_shard(layer)
if own_head:
    fully_shard(model.lm_head)
fully_shard(model)
batch = FlatteningCollator()(random_examples([9, 14, 5, 11], seed=rank + 1))
head, why = output_head(model)
assert head is not None, why
targets = shifted_targets(batch)
weights = torch.ones(targets.shape) / (targets != -100).sum()
loss, outputs = chunked_forward(model, batch, head, targets, weights)
loss.backward()
grads = {{n: p.grad.full_tensor() for n, p in model.named_parameters()}}
if rank == 0:
    torch.save({{"grads": grads, "logits": tuple(outputs["logits"].shape)}}, sys.argv[1] + "/rank0.pt")
dist.destroy_process_group()
"""


def _reference():
    model = tiny_model("llama")
    for rank in range(2):
        loss = model(**FlatteningCollator()(random_examples([9, 14, 5, 11], seed=rank + 1))).loss
        (loss / 2).backward()  # FSDP averages the ranks' gradients
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("layout", ["root_head", "own_head"])
def test_fsdp2_gradients_equal_the_full_logit_ones(tmp_path, layout):
    run_two_ranks(WORKER.replace("sys.argv[2]", repr(layout)), tmp_path)
    result = torch.load(tmp_path / "rank0.pt")
    assert result["logits"][-1] == 0  # no logits were formed
    for name, grad in _reference().items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
