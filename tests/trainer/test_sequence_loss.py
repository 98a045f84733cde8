"""loss_normalization="sequence": each example's mean token loss, averaged over the step's examples.

The reference is computed padded, with no packing code: one row per example, each row's mean
loss over its shifted targets, the mean over rows. PackingTrainer's step (packed micro-batches,
gradient accumulation) must give the same loss and the same gradient; "token" must stay the
token mean; the helpers must give the same per-example weights whatever the layout.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny_models import padded_batch, random_examples, tiny_model, training_args

from packing_collators import (
    FlatteningCollator,
    PackingTrainer,
    PrePackedCollator,
    count_sequences,
    sequence_loss_weights,
    sequence_mean_loss,
)

datasets = pytest.importorskip("datasets")

LENGTHS = [9, 4, 15, 7, 3, 12, 6, 10, 5, 8, 14, 2, 11, 6, 9, 4]


def _per_sequence_padded_loss(model, examples):
    """Mean over examples of each example's mean loss over its targets, from one padded batch."""
    batch = padded_batch(examples)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    token_loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=-100, reduction="none"
    )
    targets = (batch["labels"][:, 1:] != -100).float()
    per_example = (token_loss * targets).sum(1) / targets.sum(1).clamp(min=1)
    return per_example[targets.sum(1) > 0].mean()


def _token_padded_loss(model, examples):
    batch = padded_batch(examples)
    return model(**batch).loss


class _Recording(FlatteningCollator):
    """Keeps the examples of every training micro-batch (the probe's and the checks' batches skipped)."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def __call__(self, features):
        self.batches.append([{"input_ids": list(f["input_ids"]), "labels": list(f["labels"])} for f in features])
        return super().__call__(features)


def _one_step(tmp_path, normalization, accumulation):
    """One SGD step of PackingTrainer; returns the initial model, the step's examples, the grad, the logged loss."""
    train = datasets.Dataset.from_list(random_examples(LENGTHS, seed=7, completion_only=True))
    collator = _Recording()
    args = training_args(
        tmp_path, max_steps=1, gradient_accumulation_steps=accumulation, optim="sgd", learning_rate=1.0,
        weight_decay=0.0, max_grad_norm=0.0, lr_scheduler_type="constant",
    )
    trainer = PackingTrainer(
        model=tiny_model("llama"), args=args, train_dataset=train, data_collator=collator,
        max_tokens_per_batch=24, loss_normalization=normalization, packing_probe=False,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    # [0]: the support check's first examples; then the step's micro-batches (and one the loader prefetched)
    assert len(collator.batches) >= 1 + accumulation
    step = [e for batch in collator.batches[1 : 1 + accumulation] for e in batch]
    assert len(step) > accumulation  # packed: several examples per micro-batch
    grads = {n: before[n] - p.detach() for n, p in trainer.model.named_parameters()}  # lr 1: the gradient
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return before, step, grads, logged[0]


def _reference(before, examples, loss_fn):
    model = tiny_model("llama")
    model.load_state_dict(before)
    loss = loss_fn(model, examples)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("accumulation", [1, 3])
@pytest.mark.parametrize("normalization", ["sequence", "token"])
def test_a_packed_step_equals_the_padded_loss_and_gradient(tmp_path, normalization, accumulation):
    before, step, grads, logged = _one_step(tmp_path, normalization, accumulation)
    loss_fn = _per_sequence_padded_loss if normalization == "sequence" else _token_padded_loss
    loss, reference = _reference(before, step, loss_fn)
    assert logged == pytest.approx(loss, rel=1e-4)
    for name, grad in reference.items():
        # the gradient is read back as before - after an lr-1 step: float32 rounding of that subtraction
        # is about 1e-6 of the weights' scale, so the absolute tolerance scales with the gradient's largest entry
        scale = float(grad.abs().max())
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=max(1e-6, 1e-5 * scale), msg=name)


def test_sequence_and_token_means_differ_on_examples_of_unequal_length(tmp_path):
    before, step, _, _ = _one_step(tmp_path, "sequence", 2)
    sequence, _ = _reference(before, step, _per_sequence_padded_loss)
    token, _ = _reference(before, step, _token_padded_loss)
    assert abs(sequence - token) > 1e-3  # else the tests above could not tell the two apart


def test_a_bad_loss_normalization_is_refused_at_construction():
    with pytest.raises(ValueError, match="loss_normalization='example' is not supported; choose one of 'token', 'sequence'"):
        PackingTrainer(loss_normalization="example")


def test_weights_are_the_same_flattened_prepacked_and_padded():
    examples = random_examples([5, 3, 1, 6], seed=1, completion_only=True)
    flat = FlatteningCollator()(examples)
    padded = padded_batch(examples)
    padded["labels"][:, 0] = -100  # a causal LM never predicts column 0
    flat_weights = sequence_loss_weights(flat)
    padded_weights = sequence_loss_weights(padded)
    assert float(flat_weights.sum()) == float(padded_weights.sum()) == count_sequences(flat) == 3  # [x] has no target
    np.testing.assert_allclose(flat_weights[flat_weights > 0].numpy(), padded_weights[padded_weights > 0].numpy())
    rows = [
        {"input_ids": sum((e["input_ids"] for e in examples[:2]), []), "labels": sum((e["labels"] for e in examples[:2]), []),
         "seq_lengths": [5, 3]},
        {"input_ids": sum((e["input_ids"] for e in examples[2:]), []), "labels": sum((e["labels"] for e in examples[2:]), []),
         "seq_lengths": [1, 6]},
    ]
    packed = PrePackedCollator(mode="pad", max_length=8)(rows)  # several rows, no cu_seq_lens: examples found by position_ids
    assert "cu_seq_lens_q" not in packed
    np.testing.assert_allclose(sequence_loss_weights(packed).sum(1).numpy(), [2.0, 1.0])


def test_an_own_loop_with_the_helpers_equals_the_padded_per_sequence_mean():
    model = tiny_model("llama")
    examples = random_examples([7, 3, 11, 5], seed=2, completion_only=True)
    batch = FlatteningCollator()(examples)
    with torch.no_grad():
        loss = sequence_mean_loss(model(**{k: v for k, v in batch.items() if k != "labels"}).logits, batch["labels"],
                                  sequence_loss_weights(batch))
        assert float(loss) == pytest.approx(float(_per_sequence_padded_loss(model, examples)), rel=1e-5)


def test_weights_need_tensor_labels():
    with pytest.raises(ValueError, match="needs batch\\['labels'\\] as a \\(batch, tokens\\) torch tensor, got list"):
        sequence_loss_weights({"labels": [[1, 2]]})


def test_what_the_sequence_loss_would_silently_replace_is_refused(tmp_path):
    train = datasets.Dataset.from_list(random_examples([5, 7, 3], seed=0))
    with pytest.raises(ValueError, match="compute_loss_func would never be called"):
        PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=train,
                       loss_normalization="sequence", compute_loss_func=lambda outputs, labels, num_items_in_batch: 0)
    with pytest.raises(ValueError, match="label_smoothing_factor=0.1 would be ignored"):
        PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path, label_smoothing_factor=0.1),
                       train_dataset=train, loss_normalization="sequence")


def test_compute_loss_called_directly_is_the_batchs_per_sequence_mean(tmp_path):
    examples = random_examples([7, 3, 11, 5], seed=2, completion_only=True)
    trainer = PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path, gradient_accumulation_steps=4),
                             train_dataset=datasets.Dataset.from_list(examples), loss_normalization="sequence")
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model.train(), FlatteningCollator()(examples))
        reference = _per_sequence_padded_loss(trainer.model, examples)
    assert float(loss) == pytest.approx(float(reference), rel=1e-5)
