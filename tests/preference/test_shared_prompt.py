"""share_prompt=True: each pair's prompt computed once, the sequences' log-probabilities unchanged.

The same pairs in both layouts (unshared ``[P C | P R]`` and shared ``[P C R]``) give the same
per-sequence log-probabilities, under sdpa (the dense mask), a varlen kernel (keys gathered by
``kv_index``, bottom-right causal; the CPU reference kernel) and a hybrid model (its Gated DeltaNet
layers run on the keys' layout); changing a chosen completion leaves every rejected one's
log-probability exactly as it was (nothing of C reaches R), and the shared row is shorter by the prompts.
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import reference_varlen_attn, tiny_model

from packing_collators import PreferenceCollator, enable_packing
from packing_collators.loss import output_head
from packing_collators.preference._logps import pair_log_probs
from packing_collators.models import with_shared_mask

PAIRS = [
    {"prompt_ids": [5, 6, 7, 8, 9], "chosen_ids": [10, 11, 12], "rejected_ids": [13, 14]},
    {"prompt_ids": [20, 21, 22], "chosen_ids": [23], "rejected_ids": [24, 25, 26, 27]},
    {"prompt_ids": [30, 31, 32, 33, 34, 35, 36], "chosen_ids": [37, 38], "rejected_ids": [39, 40, 41]},
]


def _logps(model, pairs, share_prompt: bool, implementation: str):
    batch = PreferenceCollator(share_prompt=share_prompt)(pairs)
    batch = with_shared_mask(batch, implementation, torch.float32)
    with torch.no_grad():
        found = pair_log_probs(model, batch, output_head(model)[0])
    return found.chosen, found.rejected, batch["input_ids"].shape[1]


def _model(kind: str, monkeypatch):
    if kind == "qwen3_5":
        from _hybrids import tiny_hybrid

        return enable_packing(tiny_hybrid("qwen3_5_text")), "sdpa"
    model = tiny_model("llama", attn="sdpa").eval()
    if kind == "varlen":
        from packing_collators import register_varlen_attention
        from packing_collators.attention import _varlen

        monkeypatch.setattr(_varlen, "_load_varlen_attn", lambda query: reference_varlen_attn)
        model.set_attn_implementation(register_varlen_attention())
        return model, "packing_varlen"
    return model, "sdpa"


@pytest.mark.parametrize("kind", ["sdpa", "varlen", "qwen3_5"])
def test_the_shared_layout_gives_each_sequence_its_unshared_log_probability(kind, monkeypatch):
    model, implementation = _model(kind, monkeypatch)
    chosen, rejected, width = _logps(model, PAIRS, False, implementation)
    shared_chosen, shared_rejected, shared_width = _logps(model, PAIRS, True, implementation)
    torch.testing.assert_close(shared_chosen, chosen, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared_rejected, rejected, rtol=1e-5, atol=1e-5)
    assert width - shared_width == sum(len(p["prompt_ids"]) for p in PAIRS)  # each prompt once


@pytest.mark.parametrize("kind", ["sdpa", "varlen", "qwen3_5"])
def test_a_chosen_completion_does_not_reach_the_rejected_ones(kind, monkeypatch):
    model, implementation = _model(kind, monkeypatch)
    _, rejected, _ = _logps(model, PAIRS, True, implementation)
    changed = [dict(p, chosen_ids=[t + 40 for t in p["chosen_ids"]]) for p in PAIRS]
    other_chosen, other_rejected, _ = _logps(model, changed, True, implementation)
    assert torch.equal(other_rejected, rejected)  # exactly: no C token is among R's keys
    assert not torch.equal(other_chosen, _logps(model, PAIRS, True, implementation)[0])


def test_without_its_mask_sdpa_would_let_the_rejected_completion_see_the_chosen_one():
    # the control: the shared row under plain causal attention (no mask) changes the rejected log-probabilities
    model, _ = tiny_model("llama", attn="sdpa").eval(), None
    _, rejected, _ = _logps(model, PAIRS, True, "sdpa")
    batch = PreferenceCollator(share_prompt=True)(PAIRS)
    batch["attention_mask"] = torch.ones(1, 1, batch["input_ids"].shape[1], batch["input_ids"].shape[1]).tril().bool()
    with torch.no_grad():
        leaky = pair_log_probs(model, batch, output_head(model)[0]).rejected
    assert (leaky - rejected).abs().max() > 1e-3


def test_a_pair_whose_cut_sequences_start_differently_is_laid_out_unshared():
    collator = PreferenceCollator(share_prompt=True, max_length=7, truncation_mode="keep_end")
    batch = collator([PAIRS[0], PAIRS[1]])  # pair 0's chosen sequence loses its first prompt token; pair 1 is whole
    assert batch["cu_seq_lens_q"].tolist() == [0, 7, 14, 18, 22]  # pair 0: two sequences; pair 1: [P C], then [R]
    assert batch["cu_seq_lens_k"].tolist() == [0, 7, 14, 18, 25]  # pair 1's keys: [P C], [P R]
    assert batch["kv_index"].numel() == 25 and batch["input_ids"].shape[1] == 22


def test_the_trainer_measures_the_shared_layout_on_the_model_and_refuses_a_leak(tmp_path, monkeypatch):
    import copy

    trl = pytest.importorskip("trl")
    if tuple(int(x) for x in trl.__version__.split(".")[:2]) < (1, 16):
        pytest.skip("PackingDPOTrainer builds on TRL >= 1.16's DPOTrainer")

    import datasets
    from _pairs import text_pairs, word_tokenizer
    from trl import DPOConfig

    from packing_collators import PackingDPOTrainer
    from packing_collators.models import _shared_mask

    def trainer():
        model = tiny_model("llama", vocab_size=64, initializer_range=0.05)
        args = DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, report_to="none",
                         use_cpu=True, save_strategy="no", disable_tqdm=True, max_length=64, bf16=False)  # fmt: skip
        return PackingDPOTrainer(model=model, ref_model=copy.deepcopy(model).eval(), args=args, share_prompt=True,
                                 train_dataset=datasets.Dataset.from_list(text_pairs(8)), processing_class=word_tokenizer())  # fmt: skip

    trainer().train()  # measured and accepted
    causal = lambda batch: torch.ones(1, 1, batch["input_ids"].shape[1], batch["input_ids"].shape[1]).tril().bool()  # noqa: E731
    monkeypatch.setattr(_shared_mask, "shared_mask", causal)  # a layout that lets R see C
    with pytest.raises(ValueError, match="a chosen completion moves the rejected ones"):
        trainer().train()
