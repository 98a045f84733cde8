"""PackingTrainer's dataloaders on data a new user brings: not tokenized yet, or with nothing to train."""

from __future__ import annotations

import warnings

import pytest
from _tiny_models import tiny_model, training_args

from packing_collators import PackingTrainer

datasets = pytest.importorskip("datasets")

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
