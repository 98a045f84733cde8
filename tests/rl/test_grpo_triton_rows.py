"""Packed GRPO with the log-probabilities' chunk pass on the GPU's Triton kernel (run here by Triton's interpreter):
the entropies, the quantile mask on them, the bonus's gradient and the reference's log-probabilities, against TRL's
GRPOTrainer."""

from __future__ import annotations

import pytest
from _grpo import _compare

trl = pytest.importorskip("trl")
pytest.importorskip("triton")  # scripts/install.sh adds it (Linux x86-64); in the oldest venv where CUDA torch brought it
if tuple(int(x) for x in trl.__version__.split(".")[:2]) < (1, 16):
    pytest.skip("PackingGRPOTrainer builds on TRL >= 1.16's GRPOTrainer", allow_module_level=True)

SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, pad_token_id=0, head_dim=8, initializer_range=0.2)  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("rl_triton") / "llama"
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL), dtype=torch.float32).save_pretrained(path)
    return path


@pytest.fixture
def triton_rows(monkeypatch):
    """The chunked head's pass as the GPU runs it: the Triton kernel for every compiled chunk; counts its calls."""
    import packing_collators.loss._chunked as chunked
    from packing_collators.loss import _triton_rows

    calls = {"chunk": 0, "row_stats": 0}
    for name in calls:
        original = getattr(_triton_rows, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(_triton_rows, name, counted)
    monkeypatch.setattr(chunked, "_compiled", lambda compiled, *where: _triton_rows.chunk if compiled else None)
    return calls


def test_packed_grpo_on_the_triton_rows_trains_as_trl(tmp_path, checkpoint, triton_rows):
    # unshared: a shared prompt's check scores long random groups, a minute of the interpreter's per-row programs;
    # the shared layout on the kernel is tests/preference/test_dpo_vs_trl.py's (the same head, one row per pair)
    _compare(tmp_path, checkpoint, False, entropy_coef=0.05, top_entropy_quantile=0.5, beta=0.1)
    assert triton_rows["chunk"] > 0 and triton_rows["row_stats"] > 0  # the backward's pass and the statistics


def test_a_head_cast_to_float32_on_the_triton_rows_projects_as_trls(tmp_path, tmp_path_factory, triton_rows):
    """cast_lm_head_to_fp32 under TRL's default bf16, the chunk pass on the kernel: the float32 projection reaches it
    in float32 (a model without decoder layers, so only the head can differ; tests/rl/test_grpo_setups.py)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("rl_triton_head") / "head_only"
    config = AutoConfig.for_model("llama", **{**SMALL, "num_hidden_layers": 0})
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    _compare(tmp_path, path, False, bf16=True, cast_lm_head_to_fp32=True)
    assert triton_rows["chunk"] > 0
