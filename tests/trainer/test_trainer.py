"""Stock Trainer with FlatteningCollator, PackingTrainer (multipack), resume, checks, loss curves."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _tiny_models import padded_batch, random_examples, tiny_model, training_args

from packing_collators import FlatteningCollator, PackingCheckCallback, PackingTrainer

datasets = pytest.importorskip("datasets")
from transformers import Trainer, TrainerCallback  # noqa: E402

LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4]


def dataset(lengths=LENGTHS, **extra_columns):
    rows = random_examples(lengths, seed=7, completion_only=True)
    for name, values in extra_columns.items():
        for row, value in zip(rows, values):
            row[name] = value
    return datasets.Dataset.from_list(rows)


def losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_stock_trainer_logs_the_same_losses_packed_and_padded(tmp_path):
    # Same data order (same seed, same dataset length), gradient accumulation 2, completion-only
    # labels so micro-batches hold different label counts: num_items_in_batch must weight them.
    text = [f"example {i}" for i in range(len(LENGTHS))]  # a column remove_unused_columns drops
    runs = {}
    for name, collator in {"packed": FlatteningCollator(), "padded": padded_batch}.items():
        trainer = Trainer(
            model=tiny_model("llama"),
            args=training_args(tmp_path / name),
            train_dataset=dataset(text=text),
            data_collator=collator,
            callbacks=[PackingCheckCallback()] if name == "packed" else None,
        )
        trainer.train()
        runs[name] = losses(trainer)
    assert len(runs["packed"]) == 4
    np.testing.assert_allclose(runs["packed"], runs["padded"], rtol=1e-4)
    assert len(set(runs["packed"])) > 1  # it trained


def test_packing_trainer_is_a_one_line_switch_and_counts_steps(tmp_path):
    trainer = PackingTrainer(
        model=tiny_model("qwen2"),
        args=training_args(tmp_path, max_steps=-1, num_train_epochs=2),
        train_dataset=dataset(),
        max_tokens_per_batch=32,
    )
    assert isinstance(trainer.data_collator, FlatteningCollator)
    loader = trainer.get_train_dataloader()
    sampler = trainer._train_batch_sampler
    batches = list(sampler)
    assert all(sum(LENGTHS[i] for i in batch) <= 32 for batch in batches)
    assert sorted(i for batch in batches for i in batch) == list(range(len(LENGTHS)))
    assert len(loader) == len(sampler) == len(batches)
    trainer.train()
    steps_per_epoch = math.ceil(len(batches) / 2)
    assert trainer.state.max_steps == trainer.state.global_step == 2 * steps_per_epoch
    assert trainer._train_batch_sampler.epoch == 1  # set_epoch reached the sampler train() built
    assert all(np.isfinite(losses(trainer)))


def test_the_rank_balancing_weight_reaches_the_sampler_and_is_checked_at_construction(tmp_path):
    trainer = PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset(), attention_weight=3e-5
    )
    trainer.get_train_dataloader()
    assert trainer._train_batch_sampler.attention_weight == 3e-5
    with pytest.raises(ValueError, match=r"attention_weight must be a finite number >= 0, got -1\."):
        PackingTrainer(
            model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset(), attention_weight=-1
        )


def test_default_token_budget_follows_the_batch_size(tmp_path):
    trainer = PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset())
    lengths = np.array(LENGTHS)
    assert trainer.planned_budget(lengths, 4).tokens == round(4 * lengths.mean()) == 31
    assert trainer.planned_budget(np.array([3, 50]), 1).tokens == 50  # never below the longest example


class _BothRanks:
    """Rank 0's then rank 1's batch of a 2-rank plan, step by step: what one process with
    gradient accumulation 2 trains on to reproduce a 2-GPU run."""

    def __init__(self, lengths, budget):
        from packing_collators import MultipackBatchSampler

        self.ranks = [MultipackBatchSampler(lengths, budget, num_replicas=2, rank=r, seed=0) for r in range(2)]

    def set_epoch(self, epoch):
        for sampler in self.ranks:
            sampler.set_epoch(epoch)

    def __len__(self):
        return 2 * len(self.ranks[0])

    def __iter__(self):
        for pair in zip(*self.ranks):
            yield from pair


def test_make_batch_sampler_override_decides_the_micro_batches(tmp_path):
    class BothRanksTrainer(PackingTrainer):
        def make_batch_sampler(self, lengths, max_tokens_per_batch, *, shuffle):
            return _BothRanks(lengths, max_tokens_per_batch)

    seen = []

    class Recording(FlatteningCollator):
        def __call__(self, features):
            seen.append(sorted(len(f["input_ids"]) for f in features))
            return super().__call__(features)

    args = training_args(tmp_path, max_steps=-1, num_train_epochs=1)
    trainer = BothRanksTrainer(
        model=tiny_model("llama"),
        args=args,
        train_dataset=dataset(),
        data_collator=Recording(),
        max_tokens_per_batch=24,
    )
    trainer.add_callback(_ClearOnTrainBegin(seen))
    trainer.train()
    planned = [sorted(LENGTHS[i] for i in batch) for batch in _BothRanks(LENGTHS, 24)]
    assert len(planned) % 2 == 0 and len(planned) >= 4
    assert seen == planned  # every micro-batch, in order: rank 0's then rank 1's each step
    assert trainer.state.global_step == len(planned) // 2


def test_a_training_sampler_without_set_epoch_is_refused(tmp_path):
    class ListTrainer(PackingTrainer):
        def make_batch_sampler(self, lengths, max_tokens_per_batch, *, shuffle):
            return [[i] for i in range(len(lengths))]

    trainer = ListTrainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset())
    with pytest.raises(TypeError, match="make_batch_sampler returned a list without set_epoch"):
        trainer.get_train_dataloader()


class _ClearOnTrainBegin(TrainerCallback):
    """Forget the probe batch the packing checks collate before the first step."""

    def __init__(self, seen):
        self.seen = seen

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen.clear()


class _StopAt(TrainerCallback):
    """Stop (after saving) at a step, keeping the full run's LR schedule."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = control.should_training_stop = True


def test_resume_mid_epoch_continues_the_same_losses(tmp_path):
    def run(output, resume=None, callbacks=None):
        trainer = PackingTrainer(
            model=tiny_model("llama"),
            args=training_args(output, max_steps=-1, num_train_epochs=2, gradient_accumulation_steps=1),
            train_dataset=dataset(),
            max_tokens_per_batch=40,
            callbacks=callbacks,
        )
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    steps = full.state.global_step
    per_epoch = steps // 2
    assert per_epoch >= 3
    stop = per_epoch + 1  # inside the second epoch
    first = run(tmp_path / "part", callbacks=[_StopAt(stop)])
    assert first.state.global_step == stop
    resumed = run(tmp_path / "part", resume=str(tmp_path / "part" / f"checkpoint-{stop}"))
    assert resumed.state.global_step == steps
    np.testing.assert_allclose(losses(resumed)[-(steps - stop) :], losses(full)[stop:], rtol=1e-4)
    np.testing.assert_allclose(losses(first), losses(full)[:stop], rtol=1e-4)


def test_eval_packing(tmp_path):
    trainer = PackingTrainer(
        model=tiny_model("mistral"),
        args=training_args(tmp_path, per_device_eval_batch_size=4),
        train_dataset=dataset(),
        eval_dataset=dataset(),
        eval_packing="multipack",
        max_tokens_per_batch=32,
    )
    metrics = trainer.evaluate()
    assert np.isfinite(metrics["eval_loss"])
    stock = PackingTrainer(model=tiny_model("mistral"), args=training_args(tmp_path), eval_dataset=dataset())
    assert np.isfinite(stock.evaluate()["eval_loss"])


def _prepacked():
    # Two rows of two examples each, as pack_dataset writes them.
    return datasets.Dataset.from_list(
        [
            {
                "input_ids": [5, 6, 7, 8, 9],
                "labels": [-100, 6, 7, -100, 9],
                "position_ids": [0, 1, 2, 0, 1],
                "seq_lengths": [3, 2],
            },
            {
                "input_ids": [3, 4, 5, 6],
                "labels": [-100, 4, -100, 6],
                "position_ids": [0, 1, 0, 1],
                "seq_lengths": [2, 2],
            },
        ]
    )


def test_prepacked_rows_through_flattening_collator_are_refused(tmp_path):
    args = training_args(tmp_path, per_device_train_batch_size=2)
    stock = Trainer(
        model=tiny_model("llama"),
        args=args,
        train_dataset=_prepacked(),
        data_collator=FlatteningCollator(),
        callbacks=[PackingCheckCallback()],
    )
    with pytest.raises(ValueError, match="looks pre-packed"):
        stock.train()
    packing = PackingTrainer(model=tiny_model("llama"), args=args, train_dataset=_prepacked(), max_tokens_per_batch=16)
    packing._set_signature_columns_if_needed()
    assert {"position_ids", "seq_lengths"} <= set(packing._signature_columns)
    with pytest.raises(ValueError, match="looks pre-packed"):
        packing.train()


def test_safety_checks_run_before_the_first_step(tmp_path):
    # The Trainer copies args.use_cache (default False) into model.config.use_cache; a collator whose
    # batches say nothing of the cache leaves it on (the default FlatteningCollator's say use_cache=False)
    trainer = PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path, use_cache=True), train_dataset=dataset(),
        data_collator=FlatteningCollator(disable_cache=False),
    )  # fmt: skip
    with pytest.raises(ValueError, match="use_cache is True"):
        trainer.train()
    assert trainer.state.global_step == 0

    def with_mask(features):
        batch = FlatteningCollator()(features)
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        return batch

    trainer = PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset(), data_collator=with_mask
    )
    with pytest.raises(ValueError, match="also has an attention_mask"):
        trainer.train()


def test_option_validation_and_streaming_refusal(tmp_path):
    with pytest.raises(ValueError, match="strategy='best' is not supported"):
        PackingTrainer(strategy="best")
    with pytest.raises(ValueError, match="eval_packing='on' is not supported"):
        PackingTrainer(eval_packing="on")
    streaming = dataset().to_iterable_dataset()
    trainer = PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=streaming)
    with pytest.raises(ValueError, match="needs a map-style training dataset"):
        trainer.get_train_dataloader()


def test_on_a_stream_the_callback_reads_the_cache_flag_from_the_collator(tmp_path):
    # a stream cannot be read ahead, so no batch is checked: the collator says whether every batch turns
    # the cache off (a vision-language model's text config keeps use_cache=True after the Trainer's setting)
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(dataset())

    model, args = tiny_model("llama", use_cache=True), training_args(tmp_path)

    def begin(collator):
        loader = torch.utils.data.DataLoader(Stream(), batch_size=4, collate_fn=collator)
        PackingCheckCallback().on_train_begin(args, None, None, model=model, train_dataloader=loader)

    begin(FlatteningCollator())  # its batches say use_cache=False
    with pytest.raises(ValueError, match="model.config.use_cache is True"):
        begin(FlatteningCollator(disable_cache=False))


def _like_trl_default_collator(features):
    """What transformers' DataCollatorWithPadding / TRL's default collator make of pack_dataset rows:
    padded input_ids and labels, an all-ones attention_mask, and no position_ids or seq_lengths."""
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), width, dtype=torch.long)
    labels = torch.full((len(features), width), -100)
    mask = torch.zeros(len(features), width, dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(f["input_ids"]), torch.tensor(f["labels"]), 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def test_prepacked_rows_through_a_collator_that_drops_their_boundaries_are_refused(tmp_path):
    # Before: batches of more than one row were not checked, and these trained with cross-example attention.
    trainer = Trainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, per_device_train_batch_size=2, remove_unused_columns=False),
        train_dataset=_prepacked(),
        data_collator=_like_trl_default_collator,
        callbacks=[PackingCheckCallback()],
    )
    with pytest.raises(ValueError, match="starts at token 3 of row 0, but the batch has no boundary there .* dropped"):
        trainer.train()
    assert trainer.state.global_step == 0


def _token_weighted_padded_loss(model, examples):
    """sum of every target token's loss / number of targets, each example run alone (padded batches of one)."""
    total = count = 0.0
    model.eval()
    with torch.no_grad():
        for example in examples:
            batch = padded_batch([example])
            targets = int((batch["labels"][..., 1:] != -100).sum())
            total += float(model(**batch).loss) * targets
            count += targets
    return total / count


def test_eval_loss_is_token_weighted_however_examples_are_batched(tmp_path):
    # Before: eval_packing="multipack" averaged per-batch means (13.668 vs 13.594 padded in the report).
    eval_rows = dataset()
    reference = _token_weighted_padded_loss(tiny_model("llama"), [eval_rows[i] for i in range(len(eval_rows))])
    for eval_packing in ("multipack", "off"):
        trainer = PackingTrainer(
            model=tiny_model("llama"),
            args=training_args(tmp_path, per_device_eval_batch_size=4),
            eval_dataset=eval_rows,
            eval_packing=eval_packing,
            max_tokens_per_batch=24,
        )
        assert trainer.evaluate()["eval_loss"] == pytest.approx(reference, rel=1e-5), eval_packing


def test_predict_returns_one_row_per_example_in_dataset_order(tmp_path):
    # Before: one row per flattened batch, silently.
    rows = dataset()
    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, per_device_eval_batch_size=4),
        eval_dataset=rows,
        eval_packing="multipack",
        max_tokens_per_batch=24,
    )
    output = trainer.predict(rows)
    longest = max(LENGTHS)
    assert output.predictions.shape[:2] == (len(LENGTHS), longest)
    assert output.label_ids.shape == (len(LENGTHS), longest)
    for i, n in enumerate(LENGTHS):
        expected = [-100] + rows[i]["labels"][1:] + [-100] * (longest - n)  # first label masked, then padding
        assert output.label_ids[i].tolist() == expected
    model = trainer.model.eval()
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([rows[3]["input_ids"]])).logits[0]
    np.testing.assert_allclose(output.predictions[3, : LENGTHS[3]], alone.numpy(), atol=1e-4)
    assert trainer.eval_packing == "multipack"  # restored after predict()


def test_predict_gives_one_row_per_example_when_the_collator_pads(tmp_path):
    # Before: with pad_to_multiple_of=8 a padding segment became a row (7 examples gave 8 rows, the last ones
    # shifted), and compute_metrics got the inputs as one flat row per batch, (2, 40), beside predictions (8, 15, V).
    lengths = LENGTHS[:7]
    rows = dataset(lengths)
    seen = {}

    def compute_metrics(prediction):
        seen["inputs"], seen["predictions"] = prediction.inputs, prediction.predictions
        return {}

    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, per_device_eval_batch_size=4, include_for_metrics=["inputs"]),
        data_collator=FlatteningCollator(pad_to_multiple_of=8),
        compute_metrics=compute_metrics,
    )
    output = trainer.predict(rows)
    longest = max(lengths)
    assert output.predictions.shape[:2] == output.label_ids.shape == seen["inputs"].shape == (7, longest)
    for i, n in enumerate(lengths):
        assert seen["inputs"][i].tolist() == rows[i]["input_ids"] + [-100] * (longest - n)
    model = trainer.model.eval()
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([rows[6]["input_ids"]])).logits[0]
    np.testing.assert_allclose(output.predictions[6, : lengths[6]], alone.numpy(), atol=1e-4)


def test_neftune_noises_each_example_of_a_packed_row_as_if_alone(tmp_path):
    # Before: transformers scaled the noise by the packed row's length: four examples of 100 tokens each got
    # alpha / sqrt(400 d) = 0.044, half the 0.088 each gets alone (alpha 5, d 32).
    from packing_collators.trainer._neftune import PackedNEFTune

    lengths, alpha = [100, 100, 100, 100], 5.0
    noise = []

    class Capture(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            embeddings = model.get_input_embeddings()
            embeddings.register_forward_hook(lambda m, a, out: noise.append((out - m.weight[a[0]]).detach()))

    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=1, gradient_accumulation_steps=1, neftune_noise_alpha=alpha),
        train_dataset=dataset(lengths), max_tokens_per_batch=400,
    )  # fmt: skip
    trainer.add_callback(Capture())  # after NEFTune's: its hook sees the noise
    assert any(isinstance(callback, PackedNEFTune) for callback in trainer.callback_handler.callbacks)
    trainer.train()
    hidden = trainer.model.config.hidden_size
    row = [n for n in noise if n.shape[1] == sum(lengths)][-1][0]  # the training step's (the probe's has none)
    for example in row.split(lengths):
        bound = alpha / (100 * hidden) ** 0.5
        assert 0.95 * bound < float(example.abs().max()) <= bound
    assert len(trainer.model.get_input_embeddings()._forward_hooks) == 1  # NEFTune's hook went with training


def test_the_stock_trainers_neftune_is_refused_by_the_check(tmp_path):
    # Before: accepted; each example of a packed row got 1/sqrt(n) of the noise it gets padded.
    trainer = Trainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=1, neftune_noise_alpha=5.0),
        train_dataset=dataset(),
        data_collator=FlatteningCollator(),
        callbacks=[PackingCheckCallback()],
    )
    with pytest.raises(ValueError, match=r"NEFTune \(neftune_noise_alpha=5.0\) scales its noise by .* PackingTrainer"):
        trainer.train()


def test_overflow_drop_is_accepted_and_counted(tmp_path, caplog):
    # Before: the too-long error suggested overflow='drop', which PackingTrainer refused (TypeError).
    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=2),
        train_dataset=dataset(),
        max_tokens_per_batch=12,
    )
    with pytest.raises(ValueError, match="pass overflow='drop'"):
        trainer.get_train_dataloader()
    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=2),
        train_dataset=dataset(),
        max_tokens_per_batch=12,
        overflow="drop",
    )
    with caplog.at_level("WARNING", logger="packing_collators"):
        trainer.train()
    too_long = [n for n in LENGTHS if n > 12]
    assert (
        f"leaves out {len(too_long)} example(s) ({sum(too_long)} tokens) longer than max_tokens_per_batch=12"
        in caplog.text
    )


def test_empty_examples_are_in_no_batch_and_counted_in_the_log(tmp_path, caplog):
    examples = random_examples(LENGTHS, seed=7, completion_only=True) + [{"input_ids": [], "labels": []}] * 2
    trainer = PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path, max_steps=2),
                             train_dataset=datasets.Dataset.from_list(examples))  # fmt: skip
    with caplog.at_level("WARNING", logger="packing_collators"):
        trainer.train()
    assert "2 empty example(s) (no token) are in no batch" in caplog.text


def test_the_probe_runs_when_training_begins_and_can_be_turned_off(tmp_path):
    trainer = PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path, max_steps=1), train_dataset=dataset()
    )
    trainer.train()
    callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, PackingCheckCallback))
    assert callback.last_report.passed and callback.last_report.leak == 0.0
    assert trainer.model.training or trainer.state.global_step == 1
    off = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=1),
        train_dataset=dataset(),
        packing_probe=False,
    )
    off.train()
    callback = next(c for c in off.callback_handler.callbacks if isinstance(c, PackingCheckCallback))
    assert callback.last_report is None


def test_flash_attention_4_is_warmed_up_to_the_longest_batchable_example_before_the_first_step(monkeypatch, tmp_path):
    # FA4 compiles a kernel per batch configuration; measured on an H100, a 200M PackingTrainer run
    # without a warm-up stalled 7-9 s at step 25 (its first batch of over 256 sequences)
    from packing_collators.trainer import _check_callback
    from packing_collators.trainer._check_callback import _AttentionWarmUp

    calls = []  # each warm-up's batches: (longest sequence, sequences)
    monkeypatch.setattr(_check_callback, "run_warm_up", lambda model, layouts, autocast=None, recording=None:
                        calls.append([(max(b), len(b)) for b in layouts]))  # fmt: skip
    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path),
        train_dataset=random_examples([5, 20, 9, 3]),
        max_tokens_per_batch=32,
        attn_implementation=None,
    )
    trainer.get_train_dataloader()
    model = tiny_model("llama")
    _AttentionWarmUp(trainer).on_train_begin(None, None, None, model=model)
    assert calls == []  # sdpa compiles nothing
    model.config._attn_implementation = "flash_attention_4"
    callback = _AttentionWarmUp(trainer)
    callback.on_train_begin(None, None, None, model=model)
    # the plan's micro-batches' longest sequences (20, and 5 with the loss head's 16-token check) fall in the octaves
    # up to 16 and (16, 20]: both ends of each; 32 tokens hold at most 10 sequences, so never FA4's many-sequence
    # variant (over 256)
    assert [longest for longest, _ in calls[0]] == [16, 17, 20] and max(n for _, n in calls[0]) <= 10
    assert callback.seconds is not None
    callback.new_epoch()  # the same plan: nothing new to warm
    assert len(calls) == 1
    trainer.max_tokens_per_batch, trainer.overflow = 16, "drop"
    trainer.get_train_dataloader()
    _AttentionWarmUp(trainer).on_train_begin(None, None, None, model=model)
    assert max(longest for longest, _ in calls[-1]) == 16  # never longer than the token budget


# --- the training data itself: nothing to train on, ids past the embedding ----------------------


def test_an_empty_train_dataset_is_refused_before_the_first_step(tmp_path):
    empty = dataset().select([])
    trainer = PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=empty)
    with pytest.raises(ValueError, match="The train_dataset has no examples, so training would run no step"):
        trainer.train()
    assert trainer.state.global_step == 0
    # a stock Trainer's RandomSampler refuses an empty dataset itself; a sequential one reaches the callback
    loader = torch.utils.data.DataLoader(empty, batch_size=2, collate_fn=FlatteningCollator())
    args = training_args(tmp_path)
    with pytest.raises(ValueError, match="The train_dataset has no examples"):
        PackingCheckCallback().on_train_begin(args, None, None, model=tiny_model("llama"), train_dataloader=loader)


def test_a_dataloader_without_batches_is_refused(tmp_path):
    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=2),
        train_dataset=dataset([20, 30]),
        max_tokens_per_batch=12,
        overflow="drop",
    )
    with pytest.raises(ValueError, match="yields no batch from its 2 examples"):
        trainer.train()


@pytest.mark.parametrize("stock", [False, True])
@pytest.mark.parametrize("view", [False, True])
def test_a_token_id_past_the_embedding_is_refused_naming_the_example(tmp_path, stock, view):
    model = tiny_model("llama")
    rows = model.get_input_embeddings().num_embeddings  # 128
    data = dataset()
    ids, labels = list(data["input_ids"]), list(data["labels"])
    ids[5] = ids[5][:2] + [rows] + ids[5][3:]
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": labels})
    expected = 5
    if view:  # a shuffled view: the example is named by its index in the view, a dropped bad row is ignored
        ids[9] = ids[9][:1] + [rows + 7] + ids[9][2:]
        data = datasets.Dataset.from_dict({"input_ids": ids, "labels": labels}).select([3, 1, 5, 0])
        expected = 2
    if stock:
        trainer = Trainer(
            model=model, args=training_args(tmp_path), train_dataset=data, callbacks=[PackingCheckCallback()]
        )
        trainer.data_collator = FlatteningCollator()
    else:
        trainer = PackingTrainer(model=model, args=training_args(tmp_path), train_dataset=data)
    with pytest.raises(
        ValueError, match=rf"Example {expected}: input_ids holds token id {rows}, but the model's input embedding has {rows} rows"
    ):
        trainer.train()
    assert trainer.state.global_step == 0


def test_ids_within_the_embedding_train_and_a_torch_dataset_is_checked_too(tmp_path):
    from packing_collators.checks import check_training_data

    model = tiny_model("llama")
    examples = random_examples([4, 6, 3], seed=1)
    check_training_data(model, examples)  # a list of dicts: read example by example
    examples[2]["input_ids"][1] = 500
    with pytest.raises(ValueError, match="Example 2: input_ids holds token id 500, but .* 128 rows"):
        check_training_data(model, examples)
    good = dataset().select(range(4))
    check_training_data(model, good)
