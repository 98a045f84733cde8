"""PackingTrainer's dataloaders on data a new user brings: a dataset that is not tokenized yet."""

from __future__ import annotations

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
