"""One process on several GPUs (``python train.py`` without torchrun): refused before the first step.

On a CPU the GPU count is set the way transformers keeps it (``args._n_gpu``, read by
``TrainingArguments.n_gpu``); one process with one GPU's count (or none) still trains.
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import FlatteningCollator, PackingCheckCallback, PackingTrainer

datasets = pytest.importorskip("datasets")
from transformers import Trainer  # noqa: E402

LAUNCH = r"this one process sees 2 GPUs.*torchrun --nproc-per-node 2 .*accelerate launch.*CUDA_VISIBLE_DEVICES=0 python"


def dataset():
    return datasets.Dataset.from_list(random_examples([9, 4, 15, 7, 3, 12, 6, 10], seed=7, completion_only=True))


def two_gpus(tmp_path):
    args = training_args(tmp_path)
    args._n_gpu = 2  # what TrainingArguments.n_gpu reads: torch.cuda.device_count() without a launcher
    assert args.n_gpu == 2 and args.world_size == 1
    return args


def test_packing_trainer_refuses_one_process_on_several_gpus_at_construction(tmp_path):
    with pytest.raises(ValueError, match=f"PackingTrainer: {LAUNCH}"):
        PackingTrainer(model=tiny_model("llama"), args=two_gpus(tmp_path), train_dataset=dataset())


def test_the_refusal_is_also_a_runtime_error_and_names_the_gpu_count(tmp_path):
    args = training_args(tmp_path)
    args._n_gpu = 4
    with pytest.raises(RuntimeError, match=r"4 GPUs .*4x too large.*torchrun --nproc-per-node 4"):
        PackingTrainer(model=tiny_model("llama"), args=args, train_dataset=dataset())


def test_packing_trainer_refuses_when_the_count_changes_after_construction(tmp_path):
    trainer = PackingTrainer(model=tiny_model("llama"), args=training_args(tmp_path), train_dataset=dataset())
    trainer.args._n_gpu = 2
    with pytest.raises(ValueError, match=f"PackingCheckCallback: {LAUNCH}"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_the_check_callback_refuses_a_stock_trainer_before_the_first_step(tmp_path):
    model = tiny_model("llama")
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(
        model=model,
        args=two_gpus(tmp_path),
        train_dataset=dataset(),
        data_collator=FlatteningCollator(),
        callbacks=[PackingCheckCallback(probe=False)],
    )
    with pytest.raises(ValueError, match=f"PackingCheckCallback: {LAUNCH}"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_one_process_still_trains(tmp_path):
    for gpus in (0, 1):  # a CPU, one GPU
        args = training_args(tmp_path / str(gpus), max_steps=1)
        args._n_gpu = gpus
        trainer = PackingTrainer(model=tiny_model("llama"), args=args, train_dataset=dataset(), packing_probe=False)
        trainer.train()
        assert trainer.state.global_step == 1


@pytest.fixture
def reference_kernel(monkeypatch):
    """packing_varlen runs on CPU with a per-segment sdpa kernel of varlen_attn's signature."""
    from _tiny_models import reference_varlen_attn

    from packing_collators import register_varlen_attention
    from packing_collators.attention import _varlen

    register_varlen_attention()
    monkeypatch.setattr(_varlen, "_load_varlen_attn", lambda query: reference_varlen_attn)


def _stream_run(tmp_path, attention: str, **accelerator):
    """The stock Trainer on a stream of examples with FlatteningCollator and the check callback: its losses, and
    the boundaries each step's model call received."""
    model = tiny_model("llama", attn=attention)
    args = training_args(tmp_path, max_steps=2, **({"accelerator_config": accelerator} if accelerator else {}))
    trainer = Trainer(model=model, args=args, train_dataset=dataset().to_iterable_dataset(),
                      data_collator=FlatteningCollator(), callbacks=[PackingCheckCallback()])  # fmt: skip
    seen = []
    model.register_forward_pre_hook(lambda m, a, k: seen.append(k["cu_seq_lens_q"].numel()) if torch.is_grad_enabled() else None,
                                    with_kwargs=True)  # fmt: skip
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry], seen


def test_a_dispatched_stream_is_refused_where_the_model_reads_the_boundaries_it_cuts(tmp_path, reference_kernel):
    """accelerate dispatches a stream's batches (slicing each tensor along dim 0): a packed row's cu_seq_lens_q/k
    keep one entry. sdpa numbers the examples from position_ids, which survive: its losses are those of the same
    stream undispatched. packing_varlen reads the boundaries (it received [0] and failed inside the kernel):
    refused when training begins, naming dispatch_batches=False, with which it trains."""
    dispatched, seen = _stream_run(tmp_path / "sdpa", "sdpa")
    whole, seen_whole = _stream_run(tmp_path / "sdpa_whole", "sdpa", dispatch_batches=False)
    assert set(seen) == {1} and min(seen_whole) > 2  # the slicing, measured
    assert dispatched == pytest.approx(whole, rel=1e-6)
    with pytest.raises(ValueError, match=r'PackingCheckCallback: accelerate dispatches .*"dispatch_batches": False'):
        _stream_run(tmp_path / "varlen", "packing_varlen")
    losses, seen = _stream_run(tmp_path / "varlen_whole", "packing_varlen", dispatch_batches=False)
    assert losses == pytest.approx(whole, rel=1e-5) and min(seen) > 2
