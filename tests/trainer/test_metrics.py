"""PackingMetricsCallback: exact token, padding, example and efficiency counts in the training logs."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny_models import padded_batch, random_examples, tiny_model
from _tiny_models import training_args as tiny_training_args

from packing_collators import FlatteningCollator, PackingMetricsCallback, PackingTrainer

datasets = pytest.importorskip("datasets")
from transformers import Trainer  # noqa: E402

LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4]
KEYS = ("num_tokens", "tokens_per_second", "padding_fraction", "examples_per_step")


def training_args(tmp_path, **overrides):
    """One epoch instead of a step count: the metrics are checked against the whole plan."""
    return tiny_training_args(tmp_path, **{"max_steps": -1, "num_train_epochs": 1, **overrides})


def dataset():
    return datasets.Dataset.from_list(random_examples(LENGTHS, seed=7, completion_only=True))


def training_logs(trainer):
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def test_packing_trainer_logs_the_planned_tokens_examples_and_efficiency(tmp_path):
    trainer = PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset(), max_tokens_per_batch=20
    )
    trainer.train()
    plan = list(trainer._train_batch_sampler)  # epoch 0's plan: the micro-batches trained, in order
    steps = [plan[i : i + 2] for i in range(0, len(plan), 2)]  # gradient accumulation 2
    tokens = [sum(LENGTHS[i] for batch in step for i in batch) for step in steps]
    logs = training_logs(trainer)
    assert len(logs) == len(steps) >= 3
    assert [entry["num_tokens"] for entry in logs] == np.cumsum(tokens).tolist()
    assert logs[-1]["num_tokens"] == sum(LENGTHS)  # every example once, every token counted once
    assert [entry["examples_per_step"] for entry in logs] == [sum(len(b) for b in step) for step in steps]
    assert [entry["padding_fraction"] for entry in logs] == [0.0] * len(steps)
    expected = [round(t / (20 * len(step)), 4) for t, step in zip(tokens, steps)]
    assert [entry["packing_efficiency"] for entry in logs] == expected
    assert all(entry["tokens_per_second"] > 0 for entry in logs)


def test_stock_trainer_with_workers_counts_in_the_main_process(tmp_path):
    # The collator runs in a dataloader worker: counting there would leave the callback at zero.
    trainer = Trainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, dataloader_num_workers=1),
        train_dataset=dataset(),
        data_collator=FlatteningCollator(),
    )
    PackingMetricsCallback().attach(trainer)
    trainer.train()
    logs = training_logs(trainer)
    assert len(logs) == 2  # 16 examples, 4 per micro-batch, 2 micro-batches per step
    counts = [entry["num_tokens"] for entry in logs]
    assert counts[0] < counts[1] == sum(LENGTHS)
    assert [entry["examples_per_step"] for entry in logs] == [8.0, 8.0]
    assert [entry["padding_fraction"] for entry in logs] == [0.0, 0.0]
    assert all(entry["tokens_per_second"] > 0 for entry in logs)
    assert not any("packing_efficiency" in entry for entry in logs)  # no token budget known


def test_padded_batches_report_their_true_pad_share(tmp_path):
    seen = []  # (real tokens, slots, rows) of each collated micro-batch, in training order

    def recording_padded_batch(features):
        batch = padded_batch(features)
        seen.append((int(batch["attention_mask"].sum()), batch["input_ids"].numel(), len(features)))
        return batch

    trainer = Trainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path),
        train_dataset=dataset(),
        data_collator=recording_padded_batch,
    )
    PackingMetricsCallback(max_tokens_per_batch=64).attach(trainer)
    trainer.train()
    logs = training_logs(trainer)
    steps = [seen[0:2], seen[2:4]]
    assert len(seen) == 4 and len(logs) == 2
    real = [sum(r for r, _, _ in step) for step in steps]
    slots = [sum(s for _, s, _ in step) for step in steps]
    assert [entry["num_tokens"] for entry in logs] == np.cumsum(real).tolist()
    assert logs[-1]["num_tokens"] == sum(LENGTHS)
    pad_share = [round(1 - r / s, 4) for r, s in zip(real, slots)]
    assert all(share > 0 for share in pad_share)
    assert [entry["padding_fraction"] for entry in logs] == pad_share
    assert [entry["examples_per_step"] for entry in logs] == [8.0, 8.0]
    assert [entry["packing_efficiency"] for entry in logs] == [round(r / 128, 4) for r in real]


@pytest.mark.parametrize("collate", ["flattening", "padded"])
def test_callbacks_list_logs_what_attach_logs_and_counts_every_real_token(tmp_path, collate):
    """The Trainer's own way, callbacks=[...]: the same numbers as attach(), num_tokens exact."""
    seen = []  # real tokens of each collated micro-batch (one epoch, no prefetch past its end)

    def collator(features):
        batch = FlatteningCollator()(features) if collate == "flattening" else padded_batch(features)
        seen.append(int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel())
        return batch

    logs = {}
    for way in ("callbacks", "attach"):
        metrics = PackingMetricsCallback(max_tokens_per_batch=64)
        trainer = Trainer(
            model=tiny_model("llama"),
            args=training_args(tmp_path / way),
            train_dataset=dataset(),
            data_collator=collator,
            callbacks=[metrics] if way == "callbacks" else None,
        )
        if way == "attach":
            metrics.attach(trainer)
        seen.clear()
        trainer.train()
        logs[way] = training_logs(trainer)
        assert [c for c in trainer.callback_handler.callbacks if isinstance(c, PackingMetricsCallback)] == [metrics]
        assert logs[way][-1]["num_tokens"] == sum(seen) == sum(LENGTHS)  # every real token once
        assert [entry["num_tokens"] for entry in logs[way]] == np.cumsum([sum(seen[0:2]), sum(seen[2:4])]).tolist()
    timed = ("tokens_per_second", "train_runtime")
    untimed = {way: [{k: v for k, v in e.items() if k not in timed} for e in logs[way]] for way in logs}
    assert untimed["callbacks"] == untimed["attach"]
    assert all(key in logs["callbacks"][0] for key in (*KEYS, "packing_efficiency"))


def test_wiring_errors_and_turning_it_off(tmp_path):
    packing = PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset())
    with pytest.raises(ValueError, match="already has a PackingMetricsCallback.*packing_metrics=False"):
        PackingMetricsCallback().attach(packing)
    with pytest.raises(ValueError, match="already has a PackingMetricsCallback.*packing_metrics=False"):
        PackingTrainer(
            model=tiny_model("llama"),
            args=training_args(tmp_path),
            train_dataset=dataset(),
            callbacks=[PackingMetricsCallback()],
        )
    metrics = PackingMetricsCallback()
    stock = Trainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset())
    assert metrics.attach(stock) is metrics.attach(stock) is metrics  # attaching twice wires once
    with pytest.raises(ValueError, match="attached to another trainer already; make one per trainer"):
        metrics.attach(Trainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset()))
    lone = PackingMetricsCallback()  # called by no trainer: nothing to wire into
    with pytest.raises(ValueError, match=r"could not find the Trainer calling it .*PackingMetricsCallback\(\)\.attach"):
        lone.on_train_begin(stock.args, stock.state, stock.control)
    off = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=1),
        train_dataset=dataset(),
        packing_metrics=False,
        packing_probe=False,
    )
    off.train()
    assert training_logs(off) and not any(key in training_logs(off)[0] for key in KEYS)


def test_a_bucketed_collators_padding_segment_is_padding_not_tokens_or_an_example(tmp_path):
    # FlatteningCollator(pad_to_buckets=...) appends a segment of token 0 without targets: the stock Trainer's
    # callback reads the collator's buckets (PackingTrainer's compiled runs hand theirs over the same way)
    collator = FlatteningCollator(pad_to_buckets=[64])
    metrics = PackingMetricsCallback(max_tokens_per_batch=64)
    trainer = Trainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset(),
                      data_collator=collator)  # fmt: skip
    metrics.attach(trainer)
    assert metrics.padding_id == 0
    trainer.train()
    logs = training_logs(trainer)
    assert logs[-1]["num_tokens"] == sum(LENGTHS)  # every real token once, none of the padding
    assert [entry["examples_per_step"] for entry in logs] == [8.0, 8.0]  # 4 examples a micro-batch, 2 a step
    assert all(0 < entry["padding_fraction"] < 1 and entry["packing_efficiency"] <= 1 for entry in logs)
    unpadded = PackingMetricsCallback()
    unpadded.pads_like(FlatteningCollator())  # no buckets: nothing is taken for padding
    assert unpadded.padding_id is None
