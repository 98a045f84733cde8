"""PackingTrainer's loss a chunk of tokens at a time: never the full logits, the same numbers.

A training step on one ~8k-token row at a 32k vocabulary is watched op by op (a TorchDispatchMode):
no floating tensor whose last dimension is the vocabulary may hold more than 4,096 rows. Its two
logged losses must equal a by-hand run of the same batches with the full logits and AdamW (token
and per-sequence normalisation); where the logits are needed the stock full-logit loss runs.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _tiny_models import random_examples, tiny_model, training_args
from torch.utils._python_dispatch import TorchDispatchMode

from packing_collators import FlatteningCollator, PackingTrainer, sequence_loss_weights, sequence_mean_loss

datasets = pytest.importorskip("datasets")

VOCAB = 32_000  # the watched step's; the exactness runs use a smaller one (the reference forms the full logits)


class _VocabRows(TorchDispatchMode):
    """The most rows any floating tensor with the vocabulary as its last dimension held (op outputs)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.most = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.dim() >= 1:
                if tensor.shape[-1] == self.vocab:
                    self.most = max(self.most, tensor.numel() // self.vocab)
        return out


class _Recording(FlatteningCollator):
    def __init__(self):
        super().__init__()
        self.batches = []

    def __call__(self, features):
        batch = super().__call__(features)
        self.batches.append(batch)
        return batch


def _examples(total: int, seed: int, vocab: int):
    lengths, rng = [], torch.Generator().manual_seed(seed)
    while sum(lengths) < total - 600:
        lengths.append(int(torch.randint(200, 600, (1,), generator=rng)))
    examples = random_examples(lengths, seed=seed, completion_only=True)
    for e in examples:  # ids over the whole vocabulary
        e["input_ids"] = [(t * 251) % vocab for t in e["input_ids"]]
        e["labels"] = [(t * 251) % vocab if t != -100 else -100 for t in e["labels"]]
    return examples


def _train(tmp_path, normalization, implementation="auto", watch=False, vocab=VOCAB, tokens=8000, bf16=False):
    examples = _examples(tokens, seed=3, vocab=vocab)
    model = tiny_model("llama", vocab_size=vocab, hidden_size=16, intermediate_size=32, initializer_range=0.02)
    start = copy.deepcopy(model)
    collator = _Recording()
    args = training_args(
        tmp_path, max_steps=2, gradient_accumulation_steps=1, learning_rate=1e-3, lr_scheduler_type="constant",
        max_grad_norm=0.0, optim="adamw_torch", weight_decay=0.0, dataloader_drop_last=False, bf16=bf16,
    )
    trainer = PackingTrainer(
        model=model, args=args, train_dataset=datasets.Dataset.from_list(examples * 2), data_collator=collator,
        max_tokens_per_batch=tokens + 192, loss_normalization=normalization, packing_probe=False, strategy="next_fit",
        loss_implementation=implementation,
    )
    mode = _VocabRows(vocab)
    if watch:
        with mode:
            trainer.train()
    else:
        trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    steps = collator.batches[1:3]  # [0]: the support check's first examples; then the two steps' micro-batches
    return start, steps, logged, mode.most, trainer


def _by_hand(model, batches, normalization: str) -> list[float]:
    """The same two steps with the full logits: the model's own loss (or the per-sequence mean), AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    model.train()
    losses = []
    for batch in batches:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**inputs).logits
        assert logits.shape[:2] == batch["input_ids"].shape  # the reference forms the full logits
        if normalization == "token":
            loss = torch.nn.functional.cross_entropy(
                logits[0, :-1].float(), batch["labels"][0, 1:], ignore_index=-100
            )
        else:
            loss = sequence_mean_loss(logits, batch["labels"], sequence_loss_weights(batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def test_a_step_at_a_32k_vocabulary_holds_no_more_than_4096_rows_of_logits(tmp_path):
    _, batches, logged, most, trainer = _train(tmp_path, "token", watch=True)
    assert next(iter(trainer._head_loss.heads.values())) is not None  # the chunked loss was checked and used
    assert [b["input_ids"].shape[1] > 7000 for b in batches] == [True, True]
    assert 0 < most <= 4096, most  # a chunk's logits, never the row's
    assert len(logged) == 2


@pytest.mark.parametrize("normalization", ["token", "sequence"])
def test_two_adamw_steps_log_the_full_logit_losses(tmp_path, normalization):
    start, batches, logged, _, trainer = _train(tmp_path, normalization, vocab=2048, tokens=2000)
    assert next(iter(trainer._head_loss.heads.values())) is not None
    assert logged == pytest.approx(_by_hand(start, batches, normalization), rel=1e-5, abs=1e-6)


def test_the_full_logit_loss_holds_the_row_and_logs_the_same(tmp_path):
    start, batches, logged, most, _ = _train(tmp_path, "token", implementation="full", watch=True, vocab=2048, tokens=2000)
    assert most > 1500  # what the chunked loss avoids: the whole row's logits
    assert logged == pytest.approx(_by_hand(start, batches, "token"), rel=1e-5, abs=1e-6)


def test_float32_weights_under_bf16_autocast_keep_the_chunked_loss(tmp_path):
    # TRL's configs and many scripts train float32 weights with bf16=True: the head check must see the autocast the
    # forward runs under, or it falls back to the full logits (the memory the chunked loss exists to save)
    _, _, logged, most, trainer = _train(tmp_path / "chunked", "token", watch=True, vocab=2048, tokens=2000, bf16=True)
    assert next(iter(trainer._head_loss.heads.values())) is not None and 0 < most < 1500  # never the ~2,000-token row
    _, _, full, _, _ = _train(tmp_path / "full", "token", implementation="full", vocab=2048, tokens=2000, bf16=True)
    assert logged == pytest.approx(full, rel=1e-2)  # the same bf16 logits' loss, chunk by chunk


def _eval_trainer(tmp_path, compute_metrics=None):
    examples = _examples(1500, seed=5, vocab=2048)
    model = tiny_model("llama", vocab_size=2048, hidden_size=16, intermediate_size=32, initializer_range=0.02)
    args = training_args(tmp_path, per_device_eval_batch_size=4)
    return PackingTrainer(
        model=model, args=args, eval_dataset=datasets.Dataset.from_list(examples), packing_probe=False,
        compute_metrics=compute_metrics,
    ), model


def test_evaluation_without_metrics_computes_the_loss_alone_in_chunks(tmp_path):
    trainer, model = _eval_trainer(tmp_path)
    shapes = []
    model.lm_head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    chunked = trainer.evaluate()["eval_loss"]
    batches = [shape for shape in shapes[1:]]  # [0]: the head check's 16 tokens, with its logits
    assert shapes[0] == (1, 16, 2048) and batches and all(shape[-1] == 0 for shape in batches)  # no logits formed
    trainer._head_loss = type(trainer._head_loss)("full")
    assert trainer.evaluate()["eval_loss"] == pytest.approx(chunked, rel=1e-5)


def test_evaluation_with_metrics_hands_compute_metrics_the_logits(tmp_path):
    seen = []

    def metrics(prediction):
        seen.append(prediction.predictions.shape)
        return {"rows": float(prediction.predictions.shape[0])}

    trainer, model = _eval_trainer(tmp_path, compute_metrics=metrics)
    result = trainer.evaluate()
    assert seen and seen[0][-1] == 2048 and result["eval_rows"] == seen[0][0]  # per-example logits, full vocabulary
