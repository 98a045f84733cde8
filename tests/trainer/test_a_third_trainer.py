"""A third trainer on packed rows, written against the public plumbing only (no PackingTrainer, no preference/):
single completions under a token budget, each completion's log-probability read per sequence. Its first step's
loss and gradients equal the model's own padded loss on the same examples: the parts compose exactly."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import torch
from _tiny_models import tiny_model
from transformers import Trainer, TrainerCallback, TrainingArguments

from packing_collators import MultipackBatchSampler, check_packing_support, probe_packing
from packing_collators.batch import SEQUENCE_KEYS
from packing_collators.budget import GpuRun, TrainerBudget
from packing_collators.collate import FlatteningCollator, shared_prompt_batch
from packing_collators.loss import checked_head, sequence_log_probs
from packing_collators.trainer import (
    autocast_dtype,
    memory_model,
    prepared_loader,
    training_autocast,
    warm_up_packed_attention,
)

EXAMPLES = [{"input_ids": list(range(1, 4 + n % 5)) + [10 + n] * (1 + n % 3), "prompt": 3 + n % 5} for n in range(8)]


def _sequence(example) -> dict:
    ids, p = example["input_ids"], example["prompt"]
    return {"input_ids": ids, "labels": [-100] * p + ids[p:]}


class _Checks(TrainerCallback):  # the library's checks and warm-up, when training begins
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        check_packing_support(model, FlatteningCollator()([_sequence(e) for e in EXAMPLES[:4]]), probe=False)
        assert probe_packing(model, FlatteningCollator(), autocast=training_autocast(args, model)).passed
        warm_up_packed_attention(model, max(len(e["input_ids"]) for e in EXAMPLES), args)  # FA4 only: none here


class CompletionTrainer(Trainer):
    def __init__(self, *args, max_tokens_per_batch=None, **kwargs):
        self.budget = TrainerBudget(max_tokens_per_batch, memory_check=True, sequence_parallel_size=1)
        super().__init__(*args, data_collator=self.collate, **kwargs)
        self.head, _ = checked_head(self.model)
        self.add_callback(_Checks())

    @staticmethod
    def collate(examples):  # each completion a group of one: the shared-prompt layout with nothing shared
        return {**shared_prompt_batch([[_sequence(e)] for e in examples]), "count": len(examples)}

    def get_train_dataloader(self):
        lengths = np.array([len(e["input_ids"]) for e in self.train_dataset])
        gpu = GpuRun(memory_model(self), autocast_dtype(self.args), "chunked")
        tokens = self.budget.plan(lengths, self.args.per_device_train_batch_size, gpu, training=True).tokens
        sampler = MultipackBatchSampler(lengths, tokens, num_replicas=self.args.world_size, rank=self.args.process_index)
        return prepared_loader(self, self.train_dataset, sampler, self.collate)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        found = sequence_log_probs(model, inputs, self.head, count=int(inputs["count"]), bookkeeping=("count", *SEQUENCE_KEYS))
        return -found.sums.sum() / found.target_counts().sum()


def _padded_loss(model):
    pad = torch.nn.utils.rnn.pad_sequence
    sequences = [_sequence(e) for e in EXAMPLES]
    ids = pad([torch.tensor(s["input_ids"]) for s in sequences], batch_first=True)
    labels = pad([torch.tensor(s["labels"]) for s in sequences], batch_first=True, padding_value=-100)
    mask = pad([torch.ones(len(s["input_ids"]), dtype=torch.long) for s in sequences], batch_first=True)
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def test_a_trainer_built_on_the_plumbing_trains_exactly_as_the_padded_loss(tmp_path):
    model = tiny_model("llama", vocab_size=64)
    padded, packed = copy.deepcopy(model), copy.deepcopy(model)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1, learning_rate=0.0,
                             remove_unused_columns=False, logging_steps=1, save_strategy="no", disable_tqdm=True)  # fmt: skip
    trainer = CompletionTrainer(model=model, args=args, train_dataset=EXAMPLES, max_tokens_per_batch=1000)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape[0] == 1 and batch["count"] == len(EXAMPLES)  # one flat row holds every example
    trainer.train()
    expected = _padded_loss(padded)
    logged = next(log["loss"] for log in trainer.state.log_history if "loss" in log)
    assert abs(logged - float(expected.detach())) <= 1e-3  # the Trainer logs 4 significant digits
    found = CompletionTrainer.compute_loss(SimpleNamespace(head=checked_head(packed)[0]), packed, batch)
    assert abs(float(found.detach()) - float(expected.detach())) <= 1e-5 * float(expected.detach())
    expected.backward(), found.backward()
    for (name, a), b in zip(padded.named_parameters(), packed.parameters()):
        assert float((a.grad - b.grad).abs().max()) <= 1e-5 * float(a.grad.abs().max()), name
