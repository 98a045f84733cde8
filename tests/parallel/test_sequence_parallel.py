"""Sequence parallelism (packing_collators.parallel): shards, checks, and exactness against one process.

The distributed tests launch ``tests/parallel/_sp_worker.py`` as gloo ranks (``tests/_two_ranks.py``'s ``Ranks``:
forked with torch imported; float32, CPU): the
building blocks against the whole row on one rank (2 and 4 ranks, Llama / Mistral's sliding
window / Qwen2, GQA with 1 kv head), PackingTrainer(sequence_parallel_size=2) against the
one-process run of the same micro-batches, the refusals on every rank, and a leak the probe catches.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _two_ranks import Ranks

from packing_collators import FlatteningCollator
from packing_collators.parallel import (
    SequenceShardCollator,
    check_sequence_parallel_model,
    check_sequence_parallel_size,
    shard_flat_batch,
)

HERE = Path(__file__).resolve().parent


def _row(lengths, seed=0):
    rng = torch.Generator().manual_seed(seed)
    features = [{"input_ids": torch.randint(1, 100, (n,), generator=rng).tolist()} for n in lengths]
    return FlatteningCollator()(features)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_shards_rebuild_the_row_and_keep_every_target_once(size):
    row = _row([5, 1, 8, 3])
    shards = [shard_flat_batch(row, rank=r, size=size) for r in range(size)]
    ids = torch.cat([s["input_ids"] for s in shards], dim=1)
    width = -(-17 // size) * size
    assert ids.shape == (1, width) and ids[0, :17].tolist() == torch.as_tensor(row["input_ids"])[0].tolist()
    shift = torch.cat([s["shift_labels"] for s in shards], dim=1)[0]
    labels = torch.as_tensor(row["labels"])[0]
    expected = torch.cat([labels[1:], torch.tensor([-100])])
    assert shift[:17].tolist() == expected.tolist()  # FlatteningCollator masks each start: no cross-example target
    assert (shift[17:] == -100).all() and int((shift != -100).sum()) == int((labels[1:] != -100).sum())
    for s in shards:
        assert s["cu_seq_lens_q"].tolist() == [0, 5, 6, 14, 17] + ([width] if width > 17 else [])
        assert s["max_length_q"] == 8
    positions = torch.cat([s["position_ids"] for s in shards], dim=1)[0]
    assert positions[:17].tolist() == torch.as_tensor(row["position_ids"])[0].tolist()


def test_a_sequence_end_is_never_a_target_even_when_the_collator_left_labels_unmasked():
    row = {"input_ids": [[1, 2, 3, 4]], "labels": [[1, 2, 3, 4]], "position_ids": [[0, 1, 0, 1]],
           "cu_seq_lens_q": torch.tensor([0, 2, 4], dtype=torch.int32), "max_length_q": 2}
    shard = shard_flat_batch(row, rank=0, size=1)
    assert shard["shift_labels"].tolist() == [[2, -100, 4, -100]]


def test_bad_shard_inputs_are_refused():
    row = _row([3, 4])
    with pytest.raises(ValueError, match=r"rank must be in \[0, size\).*rank=2, size=2"):
        shard_flat_batch(row, rank=2, size=2)
    with pytest.raises(ValueError, match=r"lacks \['cu_seq_lens_q'\].*FlatteningCollator"):
        shard_flat_batch({k: v for k, v in row.items() if k != "cu_seq_lens_q"}, rank=0, size=2)
    with pytest.raises(ValueError, match=r"one flat row without attention_mask.*\(2, 3\)"):
        shard_flat_batch({**row, "input_ids": torch.zeros(2, 3, dtype=torch.long)}, rank=0, size=2)
    with pytest.raises(TypeError, match="collator must be callable"):
        SequenceShardCollator(None, rank=0, size=2)


def test_sizes_and_models_that_cannot_split_are_refused():
    from transformers import LlamaConfig

    assert check_sequence_parallel_size(2, 4) == 2
    with pytest.raises(ValueError, match=r"sequence_parallel_size=3 must divide the world size \(4 processes\)"):
        check_sequence_parallel_size(3, 4)
    with pytest.raises(ValueError, match="must be a positive integer"):
        check_sequence_parallel_size(0, 4)
    with pytest.raises(ValueError, match=r"num_attention_heads=3\).*e\.g\. 1"):
        check_sequence_parallel_model(LlamaConfig(num_attention_heads=3, hidden_size=24), 2)
    with pytest.raises(ValueError, match=r"attention_dropout=0\.1"):
        check_sequence_parallel_model(LlamaConfig(num_attention_heads=4, hidden_size=32, attention_dropout=0.1), 2)
    check_sequence_parallel_model(LlamaConfig(num_attention_heads=4, num_key_value_heads=1, hidden_size=32), 4)


def test_packing_trainer_refuses_a_bad_sequence_parallel_size(tmp_path):
    from _tiny_models import tiny_model, training_args

    from packing_collators import PackingTrainer

    with pytest.raises(ValueError, match="sequence_parallel_size must be a positive integer"):
        PackingTrainer(model=tiny_model(), args=training_args(tmp_path), sequence_parallel_size=0)
    with pytest.raises(ValueError, match=r"sequence_parallel_size=2 must divide the world size \(1 processes\)"):
        PackingTrainer(model=tiny_model(), args=training_args(tmp_path), sequence_parallel_size=2)


# ----------------------------------------------------------------------------- distributed (gloo ranks)


def _launch(nproc: int, logs: Path, *args: str) -> Ranks:
    # the ranks are forked with torch imported (tests/_preloaded.py) and import this checkout's package
    return Ranks([HERE / "_sp_worker.py", *args], logs, nproc)


def _wait(ranks: Ranks, timeout: int = 150) -> str:
    state, outputs = ranks.wait(timeout)
    if state == "hung":
        pytest.fail("a rank hung (a refusal raised on one rank only leaves the others in a collective)")
    assert state == "done", ranks.failed_output(outputs)[-8000:]
    return "\n".join(outputs)


def _run(nproc: int, *args: str) -> str:
    return _wait(_launch(nproc, Path(args[1]) / "logs", *args))


@pytest.mark.slow
@pytest.mark.distributed
def test_building_blocks_on_two_ranks_equal_the_whole_row_and_the_probe_catches_a_leak(tmp_path):
    configs = ("llama:1", "mistral:2", "qwen2:2", "llama:1:varlen", "mistral:2:varlen", "llama:1:varlen:fsdp")
    _run(2, "blocks", str(tmp_path), "configs=" + ",".join(configs), "leak=yes")
    ranks = [json.loads((tmp_path / f"blocks_rank{r}.json").read_text()) for r in range(2)]
    # 1 kv head: repeated to 2; Mistral: sliding window 5; sdpa (the packed mask built from cu_seq_lens)
    # and a CPU varlen kernel reading only cu_seq_lens / max_length (the path packing_varlen / packing_fa4 take);
    # fsdp: FSDP2 (fully_shard over the group) instead of summing replicated gradients
    for config in configs:
        for result in ranks:
            assert result[config]["loss"] == pytest.approx(result[config]["reference"], abs=1e-5)
            assert result[config]["gradient_gap"] < 1e-5
            assert result[config]["probe"] is True
    for result in ranks:  # a mask causal over the whole row: a wrong loss, and the probe says so
        leak = result["leak"]
        assert abs(leak["loss"] - leak["reference"]) > 1e-2
        assert "packing probe FAILED" in leak["probe"] and "leak 0 " not in leak["probe"]


@pytest.mark.slow
@pytest.mark.distributed
def test_building_blocks_on_four_ranks_with_one_kv_head(tmp_path):
    _run(4, "blocks", str(tmp_path), "configs=qwen2:1")
    for r in range(4):
        result = json.loads((tmp_path / f"blocks_rank{r}.json").read_text())["qwen2:1"]
        assert result["loss"] == pytest.approx(result["reference"], abs=1e-5)
        assert result["gradient_gap"] < 1e-5 and result["probe"] is True


@pytest.mark.slow
@pytest.mark.distributed
def test_packing_trainer_sequence_parallel_with_checkpointing_equals_one_process(tmp_path):
    # one process at the group's budget (2 x 24) sees the same micro-batches as the group of 2
    single = _launch(1, tmp_path / "logs1", "trainer", str(tmp_path), "sp=1", "budget=48")
    group = _launch(2, tmp_path / "logs2", "trainer", str(tmp_path), "sp=2", "budget=24", "gc=1")  # checkpointing
    for ranks in (single, group):
        _wait(ranks)
    one = json.loads((tmp_path / "trainer_sp1_rank0.json").read_text())
    for rank in range(2):
        run = json.loads((tmp_path / f"trainer_sp2_rank{rank}.json").read_text())
        assert run["steps"] == one["steps"] == 3 and run["gradient_checkpointing"]
        assert run["chunked_loss"] == one["chunked_loss"] == [True]  # each shard's loss a chunk at a time
        assert run["losses"] == pytest.approx(one["losses"], abs=1e-5)
        assert run["grad_norms"] == pytest.approx(one["grad_norms"], rel=1e-5)
        assert run["eval_loss"] == pytest.approx(one["eval_loss"], abs=1e-5)  # eval_packing="multipack", sharded
        # the logs count a group's examples once (not once per shard); the row's padding to a multiple of 2
        # is a segment of its own: at most one more "example" per micro-batch (2 per step)
        for sharded, whole in zip(run["examples_per_step"], one["examples_per_step"]):
            assert whole <= sharded <= whole + 2
        gap = max(abs(a - b) for key in one["weights"] for a, b in zip(one["weights"][key], run["weights"][key]))
        assert gap < 1e-5
        assert run["probe"].startswith("packing probe passed") and "sequence_parallel_size=2" in run["probe"]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_groups_of_two_equal_two_data_parallel_ranks(tmp_path):
    # 4 ranks = 2 data-parallel groups x 2 sequence shards, against 2 plain data-parallel ranks at the group's
    # budget: the same sampler plan (2 replicas), gradients reduced over all 4 ranks, eval loss over both groups
    (tmp_path / "dp").mkdir()
    (tmp_path / "sp").mkdir()
    plain = _launch(2, tmp_path / "dp" / "logs", "trainer", str(tmp_path / "dp"), "sp=1", "budget=48")
    mesh = _launch(4, tmp_path / "sp" / "logs", "trainer", str(tmp_path / "sp"), "sp=2", "budget=24")
    for ranks in (plain, mesh):
        _wait(ranks)
    reference = json.loads((tmp_path / "dp" / "trainer_sp1_rank0.json").read_text())
    for rank in range(4):
        run = json.loads((tmp_path / "sp" / f"trainer_sp2_rank{rank}.json").read_text())
        assert run["losses"] == pytest.approx(reference["losses"], abs=1e-5)
        assert run["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5)
        assert run["eval_loss"] == pytest.approx(reference["eval_loss"], abs=1e-5)
        gap = max(abs(a - b) for key in run["weights"] for a, b in zip(run["weights"][key], reference["weights"][key]))
        assert gap < 1e-5


@pytest.mark.slow
@pytest.mark.distributed
def test_packing_trainer_refuses_on_every_rank_before_training(tmp_path):
    _run(2, "refusals", str(tmp_path))
    for rank in range(2):
        errors = json.loads((tmp_path / f"refusals_rank{rank}.json").read_text())
        assert "num_attention_heads=3" in errors["heads"] and "sequence_parallel_size=2" in errors["heads"]
        assert "must divide the world size (2 processes)" in errors["world"]
        assert "9 tokens, more than max_tokens_per_batch=8" in errors["budget"]
        assert "a group's budget is 2 x max_tokens_per_batch=4" in errors["budget"]
