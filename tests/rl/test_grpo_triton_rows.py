"""Packed GRPO with the log-probabilities' chunk pass on the GPU's Triton kernel (run here by Triton's interpreter):
the entropies, their ties and the bonus's gradient from the kernel's statistics, against TRL's GRPOTrainer."""

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
    monkeypatch.setattr(chunked, "_compiled", lambda compiled, device: _triton_rows.chunk if compiled else None)
    return calls


@pytest.mark.parametrize(("share_prompt", "options"), [
    (False, {"entropy_coef": 0.05, "top_entropy_quantile": 0.5}),
    (True, {"top_entropy_quantile": 0.3, "mask_truncated_completions": True, "max_completion_length": 10}),
    (True, {"beta": 0.1, "num_iterations": 2, "steps_per_generation": 2}),
])  # fmt: skip
def test_packed_grpo_on_the_triton_rows_trains_as_trl(tmp_path, checkpoint, triton_rows, share_prompt, options):
    _compare(tmp_path, checkpoint, share_prompt, **options)
    assert triton_rows["chunk"] > 0  # the backward's gradient pass ran on the kernel
    if not options.get("mask_truncated_completions"):  # (where every completion is cut, no token is scored: the
        assert triton_rows["row_stats"] > 0  # torch 2.6 venv's draws) the statistics too, in the forward's read
