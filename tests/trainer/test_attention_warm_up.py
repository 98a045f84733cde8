"""PackingTrainer's FA4 warm-up: before any step meets a kernel variant, the warm-up met it; the model ran once.

FA4 compiles a kernel variant per configuration, chosen by thresholds on the batch's longest sequence (tiles of 64
or 128 rows, a block over 3 query heads) and by more than 256 sequences. A stand-in kernel (CPU) notes each call's
longest sequence and count, and whether the warm-up or a training step made it. Measured over two epochs of
uneven examples, packed in groups of 10 (so the second epoch's plan reaches an octave the first's did not): every
variant a step meets, the warm-up met before that step, with one model pass in all, and fewer layouts than warming
every octave from the shortest example.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import torch
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import MultipackBatchSampler, PackingTrainer, register_fa4_attention
from packing_collators.attention import FA4_MANY, _fa4, _warm_up
from packing_collators.trainer import _check_callback

THRESHOLDS = (16, 32, 64, 128, 256 / 3)


def variant(longest: int, sequences: int) -> tuple:
    return (*(longest <= t for t in THRESHOLDS), sequences > FA4_MANY)


class GroupedTrainer(PackingTrainer):
    def make_batch_sampler(self, lengths, max_tokens_per_batch, *, shuffle):
        sampler = super().make_batch_sampler(lengths, max_tokens_per_batch, shuffle=shuffle)
        return MultipackBatchSampler(lengths, **{**asdict(sampler.options), "group_size": 10}, rank=sampler.rank)


@pytest.mark.parametrize(
    "seed, count, budget, later",
    [
        (4, 40, 150, True),  # the second epoch's plan reaches (16, 32], the first's does not
        (0, 50, 200, False),  # no batch's longest is 16 or under: the loss head's check (16 tokens, step 1) is
    ],
)
def test_every_variant_a_step_meets_was_warmed_before_it_with_the_model_run_once(
    seed, count, budget, later, monkeypatch, tmp_path
):
    from transformers import TrainerCallback

    events = []  # ("warm-up" | "step", variant) per kernel call, in order
    phase = ["other"]
    passes = []

    def stand_in(q, k, v, **kwargs):
        events.append((phase[0], variant(kwargs["max_seqlen_q"], len(kwargs["cu_seqlens_q"]) - 1)))
        return q * 2.0, None

    def warm(model, layouts, **kwargs):
        phase[0] = "warm-up"
        try:
            return run_warm_up(model, layouts, **kwargs)
        finally:
            phase[0] = "other"

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            phase[0] = "step"

        def on_step_end(self, args, state, control, **kwargs):
            phase[0] = "other"

    run_warm_up, through = _warm_up.run_warm_up, _warm_up._backward_through_layers
    register_fa4_attention()
    monkeypatch.setattr(_fa4, "_kernel", lambda query: stand_in)
    monkeypatch.setattr(_check_callback, "run_warm_up", warm)
    monkeypatch.setattr(_warm_up, "_backward_through_layers", lambda *a, **k: passes.append(1) or through(*a, **k))
    lengths = np.random.default_rng(seed).integers(3, 60, count).tolist()
    trainer = GroupedTrainer(
        model=tiny_model("llama", attn="packing_fa4"),
        args=training_args(tmp_path, bf16=True, max_steps=-1, num_train_epochs=2, gradient_accumulation_steps=1,
                           logging_steps=50),  # fmt: skip
        train_dataset=random_examples(lengths),
        max_tokens_per_batch=budget,
        attn_implementation=None,
        packing_probe=False,
    )
    trainer.add_callback(Steps())
    trainer.train()

    warmed, stepped, warmed_after_a_step = set(), 0, 0
    for where, met in events:
        if where == "warm-up":
            warmed.add(met)
            warmed_after_a_step += stepped > 0
        elif where == "step":
            assert met in warmed, f"a step met variant {met} the warm-up had not"
            stepped += 1
    assert stepped > 0 and trainer.state.epoch == 2 and len(passes) == 1
    assert (warmed_after_a_step > 0) == later  # the second epoch's new octave, replayed when it began
    every_octave = _warm_up.warm_up_layouts(max(lengths), shortest=min(lengths))
    warm_calls = sum(where == "warm-up" for where, _ in events)
    layers = trainer.model.config.num_hidden_layers
    assert warm_calls - layers < len(every_octave) - 1  # the model's pass calls every layer; each replay one call
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


def test_every_rank_warms_the_same_layouts_every_ranks_batches():
    # where the warm-up runs the model (a hybrid, a compiled layer), a sharded model's passes are collectives: ranks
    # that warmed different layouts would wait on each other forever
    from packing_collators.budget import PlannedBudget
    from packing_collators.trainer._dataloader import PackedLoader

    lengths = np.random.default_rng(1).integers(3, 300, 80)
    samplers = [MultipackBatchSampler(lengths, 600, num_replicas=2, rank=r, group_size=10) for r in (0, 1)]
    mine = [{(int(lengths[b].max()), len(b)) for b in s} for s in samplers]
    assert mine[0] != mine[1]  # each rank's own batches differ
    layouts = [PackedLoader(None, s, PlannedBudget(600, 299)).batch_layouts() for s in samplers]
    assert layouts[0] == layouts[1] and set(layouts[0]) == mine[0] | mine[1]


@pytest.mark.parametrize("budget", [600, 1000])
def test_under_compile_buckets_the_planned_layouts_are_those_the_padded_rows_have(budget):
    # a compiled run pads each row to a bucket with a padding segment of its own; the warm-up reads each planned
    # batch's layout from the plan, so it must be the layout the bucketed collator gives the kernel (the padding
    # segment counted: it can be the longest sequence)
    from packing_collators import FlatteningCollator
    from packing_collators.budget import PlannedBudget
    from packing_collators.trainer._compile import compile_plan
    from packing_collators.trainer._dataloader import PackedLoader

    lengths = np.random.default_rng(2).integers(3, 300, 80)
    sampler = MultipackBatchSampler(lengths, budget, group_size=10)
    plan = compile_plan(FlatteningCollator(), sampler, budget)
    layouts = PackedLoader(None, sampler, PlannedBudget(budget, 299), compile_plan=plan).batch_layouts()
    rows = [plan.collator([{"input_ids": list(range(1, int(n) + 1))} for n in lengths[b]]) for b in sampler]
    collated = [(int(row["max_length_q"]), len(row["cu_seq_lens_q"]) - 1) for row in rows]
    assert layouts == collated
    assert any(count > len(b) for (_, count), b in zip(layouts, sampler))  # padding segments are in it
    eager = PackedLoader(None, sampler, PlannedBudget(budget, 299)).batch_layouts()
    assert eager == [(int(lengths[b].max()), len(b)) for b in sampler] != layouts
