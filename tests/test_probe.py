"""The live equivalence probe: models that keep packed examples apart pass with no leak; the others are refused.

Every refused model here was accepted by the static checks alone (``probe=False``): that is
what the probe adds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny_models import causal_over_whole_row, tiny_model

from packing_collators import FlatteningCollator, PrePackedCollator, check_packing_support
from packing_collators.trainer._probe import ProbeReport, probe_packing

transformers = pytest.importorskip("transformers")

SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128, use_cache=False
)


def _opt(attn):
    config = transformers.OPTConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        word_embed_proj_dim=32,
        max_position_embeddings=64,
        use_cache=False,
    )
    return transformers.OPTForCausalLM._from_config(config, attn_implementation=attn)


def _bert_decoder():
    return transformers.BertLMHeadModel(transformers.BertConfig(**SMALL, is_decoder=True))


def _roberta_decoder():
    return transformers.RobertaForCausalLM(transformers.RobertaConfig(**SMALL, is_decoder=True))


def _bert_masked_lm():
    return transformers.BertForMaskedLM(transformers.BertConfig(**SMALL))


def _gpt2():
    config = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=128, use_cache=False, bos_token_id=1, eos_token_id=2
    )
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_models_that_keep_examples_apart_pass_with_no_leak(arch, attn):
    report = probe_packing(tiny_model(arch, attn=attn))
    assert report.passed, report.summary()
    assert report.leak == 0.0  # exact: no other example's logits moved at all
    assert report.max_difference <= report.tolerance
    assert report.implementation == attn and report.dtype == "float32" and report.lengths == (7, 5, 9)


@pytest.mark.parametrize(
    ("make", "culprit"),
    [
        (lambda: _opt("sdpa"), "OPTAttention"),
        (lambda: _opt("eager"), "OPTAttention"),
        (_bert_decoder, "BertSelfAttention"),
        (_roberta_decoder, "RobertaSelfAttention"),
        (_bert_masked_lm, "BertSelfAttention"),  # bidirectional: A sees B, which comes after it
    ],
    ids=["opt-sdpa", "opt-eager", "bert-decoder", "roberta-decoder", "bert-masked-lm"],
)
def test_models_whose_examples_see_each_other_are_refused(make, culprit):
    torch.manual_seed(0)
    model = make()
    assert check_packing_support(model, probe=False)  # the static checks alone accept it
    with pytest.raises(ValueError, match=f"attend to each other; the first layer whose output moved: .*{culprit}"):
        check_packing_support(model)
    report = probe_packing(model)
    assert report.leak > 0 and not report.passed


def test_positions_from_another_start_are_measured():
    # GPT-2 learns absolute positions: packed positions starting at 2 give other logits than
    # the example alone, though no example sees another.
    torch.manual_seed(0)
    model = _gpt2()
    assert probe_packing(model).passed
    report = probe_packing(model, FlatteningCollator(position_ids_start=2))
    assert report.leak == 0.0 and report.max_difference > report.tolerance
    with pytest.raises(ValueError, match="No example sees another, .*position_ids_start"):
        check_packing_support(model, collator=FlatteningCollator(position_ids_start=2))


def test_prepacked_rows_are_probed_through_the_collator():
    model = tiny_model("llama")
    for collator in (PrePackedCollator(), PrePackedCollator(mode="pad", max_length=16)):
        report = probe_packing(model, collator)
        assert report.passed and report.leak == 0.0, report.summary()


def test_the_probe_restores_the_mode_and_leaves_no_hooks():
    model = tiny_model("llama").train()
    probe_packing(model)
    assert model.training
    model.eval()
    probe_packing(_opt("sdpa").eval())  # a failing probe registers hooks to find the culprit
    assert not model.training
    opt = _opt("sdpa")
    probe_packing(opt)
    assert all(not m._forward_hooks for m in opt.modules())


def test_probe_errors_and_summary():
    with pytest.raises(ValueError, match="three or more examples"):
        probe_packing(tiny_model("llama"), lengths=[4, 5])
    with pytest.raises(ValueError, match="has no parameters; pass probe=False"):
        probe_packing(_NoParameters())

    report = ProbeReport("M", "sdpa", "bfloat16", "cuda:0", (7, 5, 9), 0.2, 0.05, 0.0, None, 0.002)
    assert not report.passed and "FAILED" in report.summary()


class _NoParameters(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = transformers.LlamaConfig(vocab_size=64)


def test_a_list_of_eos_token_ids_is_avoided_not_a_crash():
    # Llama 3.1 Instruct and GLM-4 checkpoints list several eos ids; the probe hashed the list
    # (TypeError: unhashable type: 'list') instead of avoiding each id.
    from packing_collators.trainer._probe import _synthetic_tokens

    model = tiny_model("llama", eos_token_id=[2, 3], bos_token_id=1)
    tokens = np.concatenate(_synthetic_tokens(model.config, [50, 50], seed=0))
    assert not np.isin(tokens, [0, 1, 2, 3]).any()
    report = probe_packing(model)
    assert report.passed and report.leak == 0.0, report.summary()
    assert check_packing_support(model) == "sdpa"


def test_a_row_whose_examples_see_each_other_is_caught_by_the_leak_test():
    # PrePackedCollator(mode="pad") under flash attention (measured on an H200 with FA4): each row is
    # one causal sequence. The changed example shares its row with the next one, so the leak shows.
    # what transformers' flash path does with several rows and no cu_seq_lens: plain causal per row
    transformers.AttentionInterface.register("test_rows_without_boundaries", causal_over_whole_row)
    model = tiny_model("llama", attn="test_rows_without_boundaries")
    report = probe_packing(model, PrePackedCollator(mode="pad", max_length=16))
    assert report.leak > 0 and not report.passed
