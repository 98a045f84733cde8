"""TRL's SFTTrainer with packing: both recipes train the padded run's losses, and the unsafe one is refused.

- online:  SFTTrainer(data_collator=FlatteningCollator()) on tokenized examples;
- offline: SFTTrainer(data_collator=PrePackedCollator()) on pack_dataset rows;
- refused: SFTTrainer's default collator on pack_dataset rows (each row becomes one
  sequence, so its examples attend to each other), stopped by PackingCheckCallback.

Each packed run is compared with padded training of the same examples in the same
micro-batches (same data order, float32, CPU), step by step, within 1e-5. Nothing is
downloaded: tiny models from configs, a word-level tokenizer built here.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
from _tiny_models import VOCAB, random_examples, tiny_model, training_args
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer  # in the dev extra, so CI runs these tests
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from packing_collators import FlatteningCollator, PackingCheckCallback, PrePackedCollator, pack_dataset

LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4]
TOLERANCE = 1e-5  # float32 on CPU: packed and padded differ by ~2e-6 (summation order)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def word_tokenizer():
    """SFTTrainer needs a processing_class (for its pad token); one word per token id, t0 = pad."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t1"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="t0", unk_token="t1", eos_token="t2")


def sft_config(tmp_path, **overrides):
    """training_args (4 steps, accumulation 2, float32 on CPU) as an SFTConfig that takes the dataset as is.

    SFTConfig's own defaults differ (bf16=True, gradient_checkpointing=True); the TrainingArguments
    values carried over keep both off. ``skip_prepare_dataset``: the rows are tokenized already, and
    SFTTrainer's preparation would cut rows over its max_length (1024) but not their ``seq_lengths``.
    """
    return SFTConfig(**training_args(tmp_path, **overrides).to_dict(), dataset_kwargs={"skip_prepare_dataset": True})


def examples_dataset():
    return datasets.Dataset.from_list(random_examples(LENGTHS, seed=7, completion_only=True))


def example_lengths(features):
    """Lengths of the examples in a micro-batch: one per example, or each packed row's seq_lengths."""
    return sorted(n for f in features for n in f.get("seq_lengths", [len(f["input_ids"])]))


class MicroBatches(TrainerCallback):
    """Wraps a collator and records the example lengths of every training micro-batch."""

    def __init__(self, collate):
        self.collate, self.seen = collate, []

    def __call__(self, features):
        self.seen.append(example_lengths(features))
        return self.collate(features)

    def on_train_begin(self, *args, **kwargs):
        self.seen.clear()  # forget the batches the packing check collated


def train(tmp_path, dataset, collate, *, check: bool, **overrides):
    """Per-step losses of an SFTTrainer run and the micro-batches it trained on (example lengths)."""
    recorder = MicroBatches(collate)
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=sft_config(tmp_path, **overrides),
        train_dataset=dataset,
        data_collator=recorder,
        processing_class=word_tokenizer(),
        callbacks=[PackingCheckCallback()] if check else None,
    )
    trainer.add_callback(recorder)  # after the check, so the check's probe batches are forgotten
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry], recorder.seen


# Like for like: in every run SFTTrainer.compute_loss divides the summed token NLL of a micro-batch
# by num_items_in_batch, the trained labels of all the step's micro-batches (the Trainer counts
# labels[..., 1:] != -100), and the step's logged loss is the sum over its micro-batches: a
# token-weighted mean over the same batches. Each example's first token is never a target in
# either layout (padded: first column; packed: label -100), so the counts agree too.
# The padded reference is TRL's own padded collator (what SFTTrainer uses by default).
PADDED = DataCollatorForLanguageModeling(pad_token_id=0)


def test_sft_trainer_with_flattening_collator_logs_the_padded_losses(tmp_path):
    packed, packed_batches = train(tmp_path / "packed", examples_dataset(), FlatteningCollator(), check=True)
    padded, padded_batches = train(tmp_path / "padded", examples_dataset(), PADDED, check=False)
    assert len(packed_batches) == 8 and packed_batches == padded_batches  # 4 steps x 2 micro-batches of 4
    assert len(packed) == 4 and len(set(packed)) > 1  # it trained
    np.testing.assert_allclose(packed, padded, rtol=0, atol=TOLERANCE)


def unpacked(rows):
    """pack_dataset rows split back into their examples (input_ids, labels), in order."""
    examples = []
    for row in rows:
        bounds = np.cumsum([0, *row["seq_lengths"]])
        for start, end in zip(bounds[:-1], bounds[1:]):
            examples.append({"input_ids": row["input_ids"][start:end], "labels": row["labels"][start:end]})
    return examples


def test_sft_trainer_with_pack_dataset_rows_logs_the_padded_losses(tmp_path):
    rows = pack_dataset(examples_dataset(), max_length=24, seed=0)
    assert max(len(r) for r in rows["seq_lengths"]) > 1  # rows hold several examples
    two_rows = dict(per_device_train_batch_size=2)
    packed, packed_batches = train(tmp_path / "packed", rows, PrePackedCollator(), check=True, **two_rows)
    # Padded reference: the same rows in the same order, split back into their examples, padded.
    padded, padded_batches = train(
        tmp_path / "padded", rows, lambda features: PADDED(unpacked(features)), check=False, **two_rows
    )
    # 6 rows, 2 per micro-batch, accumulation 2: each epoch is steps of 2 and 1 micro-batches.
    assert len(packed_batches) == 6 and packed_batches == padded_batches
    assert len(packed) == 4 and len(set(packed)) > 1
    np.testing.assert_allclose(packed, padded, rtol=0, atol=TOLERANCE)
    # Cross-example attention (TRL's collator on the rows: each row one sequence) moves the losses
    # far beyond the tolerance, so the comparison above would catch it.
    joined, _ = train(tmp_path / "joined", rows, PADDED, check=False, **two_rows)
    assert np.max(np.abs(np.subtract(joined, padded))) > 1000 * TOLERANCE


def test_sft_trainer_default_collator_on_packed_rows_is_refused(tmp_path):
    rows = pack_dataset(examples_dataset(), max_length=24, seed=0)
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=sft_config(tmp_path, per_device_train_batch_size=2),
        train_dataset=rows,
        processing_class=word_tokenizer(),
        callbacks=[PackingCheckCallback()],
    )
    assert isinstance(trainer.data_collator, DataCollatorForLanguageModeling)  # TRL's default, padded rows
    with pytest.raises(
        ValueError, match=r"joined examples.*looks pre-packed.*TRL's default collator.*PrePackedCollator"
    ):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.slow
def test_example_script_trains_both_recipes(tmp_path):
    from _preloaded import run  # the script forked with torch imported, as `python sft_trl.py ...` runs it

    command = [str(EXAMPLES / "sft_trl.py"), "--max-examples", "24", "--batch-size", "4"]
    command += ["--max-length", "96", "--logging-steps", "1", "--pack-length", "192"]
    code, stdout, stderr = run(command, cwd=EXAMPLES.parent)
    assert code == 0, stderr[-3000:]
    titles = [line for line in stdout.splitlines() if line.startswith("== ")]
    assert titles == ["== SFTTrainer + FlatteningCollator ==", "== SFTTrainer + pack_dataset + PrePackedCollator =="]
    losses = [float(line.split(":")[1]) for line in stdout.splitlines() if line.startswith("final loss:")]
    assert len(losses) == 2 and all(np.isfinite(losses))
