"""The Trainer on data a new user brings: not tokenized yet, nothing to train, a column kept per example."""

from __future__ import annotations

import warnings

import pytest
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import PackingCheckCallback, PackingTrainer, PrePackedCollator, pack_dataset

datasets = pytest.importorskip("datasets")
from transformers import Trainer  # noqa: E402

UNTOKENIZED = (
    r"PackingTrainer packs tokenized examples, and the training dataset has no 'input_ids' column "
    r"\(its columns: \['text'\]\)\. Tokenize it first .*tokenizer\(example\[\"text\"\]\).*tokenize_chat.*"
    r"or pass PackingTrainer\(length_column=\.\.\.\)"
)


@pytest.mark.parametrize("remove_unused_columns", [True, False])
def test_an_untokenized_dataset_says_tokenize_first_and_names_length_column(tmp_path, remove_unused_columns):
    # remove_unused_columns=True used to end in transformers' "set remove_unused_columns=False", and that
    # in "pass column=", an argument PackingTrainer does not have.
    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, remove_unused_columns=remove_unused_columns),
        train_dataset=datasets.Dataset.from_dict({"text": ["hello world", "a b c"]}),
    )
    with pytest.raises(ValueError, match=UNTOKENIZED):
        trainer.train()
    with pytest.raises(TypeError):
        PackingTrainer(column="input_ids")  # the advice must not name this


def test_an_untokenized_list_of_examples_says_tokenize_first(tmp_path):
    trainer = PackingTrainer(
        model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=[{"text": "hello"}, {"text": "a b"}]
    )
    with pytest.raises(ValueError, match=r"lacks .*tokenize the dataset first, or pass length_column="):
        trainer.train()


def test_labels_all_minus_100_are_warned_about_once_per_run_not_per_step(tmp_path):
    rows = [{"input_ids": list(range(1, n + 1)), "labels": [-100] * n} for n in (5, 3, 6, 4, 7, 2, 5, 3)]
    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=3, gradient_accumulation_steps=1),
        train_dataset=datasets.Dataset.from_list(rows),
        max_tokens_per_batch=8,
        packing_probe=False,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    told = [str(w.message) for w in caught if "has no label to train" in str(w.message)]
    assert trainer.state.global_step == 3 and len(told) == 1
    assert told[0].startswith("FlatteningCollator: a batch of ")


class KeptColumnTrainer(Trainer):
    """A Trainer that takes the kept column out of each batch before the forward (its own use of it)."""

    seen: list

    def compute_loss(self, model, inputs, *args, **kwargs):
        self.seen.append(inputs.pop("source"))
        return super().compute_loss(model, inputs, *args, **kwargs)


def test_a_column_kept_per_example_trains_when_taken_out_before_the_forward(tmp_path):
    rows = random_examples([9, 4, 15, 7, 3, 12, 6, 10], seed=7, completion_only=True)
    for i, row in enumerate(rows):
        row["source"] = ["web", "math"][i % 2]
    packed = pack_dataset(datasets.Dataset.from_list(rows), 24, keep_columns=["source"])
    trainer = KeptColumnTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, remove_unused_columns=False, per_device_train_batch_size=2, max_steps=2),
        train_dataset=packed,
        data_collator=PrePackedCollator(keep_columns=["source"]),
        callbacks=[PackingCheckCallback()],  # its probe's synthetic rows carry no source
    )
    trainer.seen = []
    trainer.train()
    assert trainer.state.global_step == 2 and all(set(s) <= {"web", "math"} and s for s in trainer.seen)
