"""TRL's generation inside PackingGRPOTrainer / PackingRLOOTrainer with the policy on this library's packed-only
attention: ``packing_fa4`` and ``packing_varlen`` refuse padded batches and decoding with a cache, so the policy
decodes under the transformers implementation of the same kernel (flash_attention_4; sdpa for torch's varlen, and
where transformers cannot run FA4, as on this CPU) and is back on its packed attention for the scoring forward.
Found on an H100: the GRPO harness's packed settings could not generate on packing_fa4 (benchmarks/results/grpo_h100_fa4)."""

from __future__ import annotations

import importlib.util

import pytest
from _tiny_models import tiny_model
from _words import word_tokenizer

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


# RLOO scores the old policy right after generating: on this CPU only packing_fa4 can (its reference kernel)
@pytest.mark.parametrize("packed, rloo", [("packing_varlen", False), ("packing_fa4", False), ("packing_fa4", True)])
def test_the_policy_decodes_under_the_same_kernel_and_scores_on_its_packed_attention(tmp_path, fa4_reference, packed,
                                                                                      rloo):  # fmt: skip
    from packing_collators import PackingGRPOTrainer, PackingRLOOTrainer, choose_attention

    config_class = trl.RLOOConfig if rloo else trl.GRPOConfig
    model = tiny_model("llama", vocab_size=64)
    choose_attention(model, packed)
    config = config_class(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, beta=0.0,
                          max_completion_length=6, use_cpu=True, bf16=False, report_to="none", save_strategy="no")  # fmt: skip
    trainer = (PackingRLOOTrainer if rloo else PackingGRPOTrainer)(
        model=model, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions], args=config,
        train_dataset=datasets.Dataset.from_list([{"prompt": "w1 w2 w3"}] * 4), processing_class=word_tokenizer(),
        packing_probe=False,
    )  # fmt: skip
    seen = []  # (rows of the call, the attention it ran under)

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen.append((ids.shape[0], module.config._attn_implementation))

    trainer.model.register_forward_pre_hook(record, with_kwargs=True)
    batch = trainer._generate_and_score_completions([{"prompt": "w1 w2 w3"}, {"prompt": "w4 w5"}] * 2)
    assert batch["completion_ids"].shape[0] == 4 and batch["completion_mask"].sum() > 0
    fa4_here = importlib.util.find_spec("flash_attn") is not None and packed == "packing_fa4"
    decoding = [attention for rows, attention in seen if rows == 4]  # generate's padded batch: prefill, decoding
    scoring = [attention for rows, attention in seen if rows == 1]  # RLOO's old policy: one packed row
    assert set(decoding) == {"flash_attention_4" if fa4_here else "sdpa"} and len(decoding) >= 2
    assert set(scoring) == ({packed} if rloo else set())
    assert model.config._attn_implementation == packed  # the scoring forward packs again
    assert {layer.self_attn.config._attn_implementation for layer in model.model.layers} == {packed}
