"""PackingTrainer with hybrid and vision-language models: it prepares the model itself, its first loss is the
loss of each example run alone, the checks refuse an unprepared model, and sequence parallelism is refused.

The models are configured as their checkpoints are: ``use_cache`` left at its default (True), and for
Qwen2-VL and Qwen2.5-VL the flat config.json layout, which puts it in the text config.
"""

from __future__ import annotations

import re

import pytest
import torch
from _hybrids import HYBRIDS, examples_for, tiny_hybrid
from _tiny_models import training_args
from _vlms import COMPOSITE_HYBRIDS, alone_logits, as_loaded, available, mixed_examples, tiny_vlm

from packing_collators import FlatteningCollator, PackingTrainer, check_packing_support, enable_packing
from packing_collators.models import packing_layers

datasets = pytest.importorskip("datasets")


class _Recording(FlatteningCollator):
    """Keeps the examples of every batch it collates (the probe's first, then the training micro-batches)."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def __call__(self, features):
        self.batches.append([dict(f) for f in features])
        return super().__call__(features)


def _token_loss_alone(model, examples: list[dict]) -> float:
    """The token-mean loss of ``examples``, each run alone (a batch of one): the loss padding would give."""
    total, count = 0.0, 0
    with torch.no_grad():
        for example in examples:
            example = {k: v for k, v in example.items() if v is not None}  # a text-only row of an image dataset
            inputs = {
                k: torch.as_tensor(v)[None] for k, v in example.items() if k in ("input_ids", "mm_token_type_ids")
            }
            inputs.update({k: torch.as_tensor(example[k]) for k in ("pixel_values", "image_grid_thw") if k in example})
            logits = model(**inputs).logits[0, :-1].float()
            labels = torch.as_tensor(example.get("labels", example["input_ids"]))[1:]
            losses = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
            total, count = total + float(losses), count + int((labels != -100).sum())
    return total / count


def _first_loss(tmp_path, model, reference, examples: list[dict]) -> tuple[float, float]:
    """PackingTrainer's first logged loss (one micro-batch, no accumulation) and the same examples' loss alone."""
    collator = _Recording()
    args = training_args(tmp_path, max_steps=1, gradient_accumulation_steps=1, learning_rate=0.0, optim="sgd")
    trainer = PackingTrainer(
        model=model, args=args, train_dataset=datasets.Dataset.from_list(examples), data_collator=collator,
        max_tokens_per_batch=10_000,
    )  # fmt: skip
    assert packing_layers(trainer.model) is not None  # PackingTrainer prepared it
    trainer.train()
    step = [e for batch in collator.batches[-1:] for e in batch]
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry][0]
    return logged, _token_loss_alone(reference, step)


@pytest.mark.parametrize("model_type", [t for t in ("qwen3_5_text", "nemotron_h", "granitemoehybrid") if t in HYBRIDS])
def test_the_first_loss_of_a_hybrid_is_each_example_alone(tmp_path, model_type):
    model, reference = tiny_hybrid(model_type, defaults=("use_cache",)).train(), tiny_hybrid(model_type)
    examples = [{**e, "labels": e["input_ids"]} for e in examples_for(model, (7, 12, 5, 9, 6, 11))]
    logged, alone = _first_loss(tmp_path, model, reference, examples)
    assert logged == pytest.approx(alone, rel=1e-4)


@pytest.mark.parametrize("model_type", available() + available(COMPOSITE_HYBRIDS))
def test_the_first_loss_of_a_vlm_as_loaded_is_each_example_alone(tmp_path, model_type):
    # as loaded: the text config's use_cache is True, which the Trainer's model.config.use_cache = False does
    # not reach; the collator's batches say use_cache=False, so PackingTrainer trains it as it does a text model
    model, reference = as_loaded(model_type).train(), tiny_vlm(model_type)
    assert model.config.get_text_config().use_cache is True
    examples = mixed_examples(model.config)
    for example in examples:
        example["labels"] = [t if k == 0 else -100 for t, k in zip(example["input_ids"], example["mm_token_type_ids"])]
        for key in ("pixel_values", "image_grid_thw"):
            if key in example:
                example[key] = example[key].tolist()
    logged, alone = _first_loss(tmp_path, model, reference, examples)
    assert logged == pytest.approx(alone, rel=1e-4)


def _checkpoint_like():
    vlms = [pytest.param(lambda t=t: as_loaded(t), id=t) for t in available() + available(COMPOSITE_HYBRIDS)]
    hybrids = [pytest.param(lambda t=t: tiny_hybrid(t, defaults=("use_cache",)), id=t) for t in sorted(HYBRIDS)]
    return vlms + hybrids


@pytest.mark.parametrize("build", _checkpoint_like())
def test_use_cache_is_checked_where_the_forward_reads_it_and_the_message_names_that_flag(build):
    model = enable_packing(build())
    vision = hasattr(model.config, "vision_config")
    batch = FlatteningCollator()(mixed_examples(model.config) if vision else examples_for(model))
    assert check_packing_support(model, batch, probe=False) == "sdpa"  # the batch turns the cache off
    assert check_packing_support(model, collator=FlatteningCollator(), probe=False) == "sdpa"  # so do its batches
    silent = {k: v for k, v in batch.items() if k != "use_cache"}  # a collator that says nothing of the cache
    with pytest.raises(ValueError, match=r"use_cache (is|are) True") as refused:
        check_packing_support(model, silent, probe=False)
    for statement in re.search(r"Set (.+?) before training", str(refused.value)).group(1).split(" and "):
        exec(statement, {"model": model})  # what the message says to do, done
    assert check_packing_support(model, silent, probe=False) == "sdpa"
    with torch.no_grad():
        output = model(**{k: v for k, v in silent.items() if k != "labels"})
    assert getattr(output, "past_key_values", None) is None  # the flag named is the one the forward reads


@pytest.mark.skipif("qwen2_5_vl" not in available(), reason="this transformers has no Qwen2.5-VL")
def test_a_vlm_from_its_flat_checkpoint_config_is_accepted_after_model_config_use_cache_false():
    model = as_loaded("qwen2_5_vl")
    model.config.use_cache = False  # what the README says; the text config's flag stays True
    model = enable_packing(model)
    assert check_packing_support(model, probe=False) == "sdpa"  # no batch needed: the switch reached the text model
    examples = mixed_examples(model.config)
    batch = FlatteningCollator()(examples)
    assert check_packing_support(model, batch) == "sdpa"
    silent = {k: v for k, v in batch.items() if k not in ("labels", "use_cache")}
    with torch.no_grad():
        assert getattr(model(**silent), "past_key_values", None) is None  # no cache built without the batch saying so
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        alone = alone_logits(model, examples)
    assert float((packed - alone).abs().max()) < 1e-4


def test_an_unprepared_hybrid_is_refused_and_a_prepared_one_accepted():
    model_type = "nemotron_h" if "nemotron_h" in HYBRIDS else sorted(HYBRIDS)[0]
    model = tiny_hybrid(model_type)
    batch = FlatteningCollator()(examples_for(model))
    with pytest.raises(ValueError, match=r"carry state along the sequence .*enable_packing\(model\)"):
        check_packing_support(model, batch)
    assert check_packing_support(enable_packing(model), batch) == "sdpa"


def test_sequence_parallelism_is_refused_for_a_hybrid(tmp_path):
    model_type = "nemotron_h" if "nemotron_h" in HYBRIDS else sorted(HYBRIDS)[0]
    model = tiny_hybrid(model_type)
    examples = datasets.Dataset.from_list(examples_for(model))
    with pytest.raises(ValueError, match=r"sequence_parallel_size=2 splits each packed row across ranks"):
        PackingTrainer(model=model, args=training_args(tmp_path), train_dataset=examples, sequence_parallel_size=2)


class _Smear(torch.nn.Module):
    """A token mixer enable_packing cannot recognise: each position adds the mean of the row before it."""

    def forward(self, hidden_states):
        counts = torch.arange(1, hidden_states.shape[1] + 1, device=hidden_states.device)[None, :, None]
        return hidden_states + 0.5 * hidden_states.cumsum(1) / counts


def test_a_layer_kind_enable_packing_does_not_know_is_refused_by_name():
    from _tiny_models import tiny_model

    model = tiny_model("llama").eval()
    model.config.use_cache = False
    model.model.layers[0].mlp = torch.nn.Sequential(_Smear(), model.model.layers[0].mlp)
    enable_packing(model)
    with pytest.raises(ValueError, match=r"_Smear\).*a layer kind it does not know"):
        check_packing_support(model)


@pytest.mark.skipif("qwen3_5_text" not in HYBRIDS, reason="this transformers has no Qwen3.5")
def test_a_hybrid_built_by_model_init_is_prepared_and_trains_exactly(tmp_path):
    # Before: train() built the model anew, unprepared, and the check refused it ("PackingTrainer calls enable_packing").
    reference = tiny_hybrid("qwen3_5_text")
    examples = [{**e, "labels": e["input_ids"]} for e in examples_for(reference, (7, 12, 5, 9, 6, 11))]
    collator = _Recording()
    args = training_args(tmp_path, max_steps=1, gradient_accumulation_steps=1, learning_rate=0.0, optim="sgd")
    trainer = PackingTrainer(
        model_init=lambda: tiny_hybrid("qwen3_5_text").train(), args=args, data_collator=collator,
        train_dataset=datasets.Dataset.from_list(examples), max_tokens_per_batch=10_000,
    )  # fmt: skip
    first = trainer.model
    trainer.train()
    assert trainer.model is not first and packing_layers(trainer.model) is not None
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry][0]
    assert logged == pytest.approx(_token_loss_alone(reference, collator.batches[-1]), rel=1e-4)
