"""loss_normalization="sequence" over 2 gloo ranks with gradient accumulation: one exact step.

Each rank trains one SGD step (learning rate 1, so the change of the weights is the gradient)
on its own packed micro-batches. The step must equal the per-sequence mean computed padded
over the examples of both ranks together: the example count is summed over ranks (as
``num_items_in_batch`` is), so an example weighs the same whichever rank it lands on.
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import tiny_model
from _two_ranks import run_two_ranks
from test_sequence_loss import _per_sequence_padded_loss

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

WORKER = r"""
import sys
sys.path.insert(0, {tests!r})
import torch
import datasets
from _tiny_models import random_examples, tiny_model, training_args
from packing_collators import FlatteningCollator, PackingTrainer

out = sys.argv[1]
lengths = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4, 13, 3, 7, 5, 16, 2, 8]
train = datasets.Dataset.from_list(random_examples(lengths, seed=7, completion_only=True))
seen = []

class Recording(FlatteningCollator):
    def __call__(self, features):
        seen.append([{{"input_ids": list(f["input_ids"]), "labels": list(f["labels"])}} for f in features])
        return super().__call__(features)

args = training_args(out + "/run", max_steps=1, gradient_accumulation_steps=2, optim="sgd", learning_rate=1.0,
                     weight_decay=0.0, max_grad_norm=0.0, lr_scheduler_type="constant")
trainer = PackingTrainer(model=tiny_model("llama"), args=args, train_dataset=train, data_collator=Recording(),
                         max_tokens_per_batch=24, loss_normalization="sequence", packing_probe=False)
trainer.train()
torch.save({{"after": {{n: p.detach() for n, p in trainer.model.named_parameters()}}, "step": seen[1:3],
            "world": args.world_size}}, out + f"/rank{{args.process_index}}.pt")
"""


def _run_two_ranks(tmp_path) -> list[dict]:
    run_two_ranks(WORKER, tmp_path)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]


def test_two_ranks_with_accumulation_take_the_per_sequence_mean_over_both(tmp_path):
    ranks = _run_two_ranks(tmp_path)
    assert [r["world"] for r in ranks] == [2, 2]
    examples = [e for r in ranks for batch in r["step"] for e in batch]
    assert len(examples) > 4 and all(len(r["step"]) == 2 for r in ranks)
    model = tiny_model("llama")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _per_sequence_padded_loss(model, examples).backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(ranks[0]["after"][name], ranks[1]["after"][name])  # DDP kept them equal
        torch.testing.assert_close(
            before[name] - ranks[0]["after"][name], parameter.grad, rtol=1e-4, atol=1e-6, msg=name
        )
