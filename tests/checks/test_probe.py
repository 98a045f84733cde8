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
from packing_collators.checks import ProbeReport, probe_packing

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


# Models the static checks accept whose packing varies with the transformers release (seen: OPT refused on 5.15-5.25;
# BERT and RoBERTa refused on 5.15-5.24; on 5.25 BERT packs exactly and is accepted, RoBERTa keeps the examples
# apart but numbers positions from padding_idx + 1 and is refused). The test holds no verdict: it measures.
UNDECIDED = {
    "opt-sdpa": lambda: _opt("sdpa"),
    "opt-eager": lambda: _opt("eager"),
    "bert-decoder": _bert_decoder,
    "roberta-decoder": _roberta_decoder,
    "bert-masked-lm": _bert_masked_lm,  # bidirectional: each example sees its own later tokens, never another's
    "llama": lambda: tiny_model("llama"),
}
EXACT = 1e-4  # max |logit| difference, float32, of an example packed vs run alone that still packs exactly


def _packed_vs_alone(model, lengths=(6, 11, 4, 8)) -> float:
    """Max |logit| difference of every example packed (FlatteningCollator) vs run alone: measured apart from the
    probe, on other lengths and tokens than its own."""
    rng = np.random.default_rng(1)
    examples = [{"input_ids": rng.integers(5, 120, n).tolist()} for n in lengths]
    model.eval()
    with torch.no_grad():
        packed = model(**FlatteningCollator()(examples)).logits[0]
        alone = torch.cat([model(input_ids=torch.tensor([e["input_ids"]])).logits[0] for e in examples])
    return (packed - alone).abs().max().item()


@pytest.mark.parametrize("name", list(UNDECIDED))
def test_the_verdict_follows_the_measurement(name):
    torch.manual_seed(0)
    model = UNDECIDED[name]()
    assert check_packing_support(model, probe=False)  # the static checks alone accept every one of them
    difference = _packed_vs_alone(model)
    try:
        check_packing_support(model)
        refusal = None
    except ValueError as error:
        refusal = str(error)
    report = probe_packing(model)
    if refusal is None:  # accepted: it packs exactly
        assert difference <= EXACT and report.passed and report.leak == 0.0, (difference, report.summary())
    else:  # refused: packing changes its outputs, and the message says how
        assert difference > EXACT and not report.passed, (difference, refusal)
        if report.leak:
            assert "attend to each other" in refusal and report.culprit and report.culprit in refusal
        else:
            assert "No example sees another" in refusal and report.max_difference > report.tolerance


class _RowMean(torch.nn.Module):
    """A layer that leaks on purpose: it adds the mean of the whole row, so each token sees every example's."""

    def forward(self, hidden_states):
        return hidden_states + hidden_states.mean(dim=1, keepdim=True)


class _LeakingMLP(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp, self.leak = mlp, _RowMean()

    def forward(self, hidden_states):
        return self.mlp(self.leak(hidden_states))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_layer_that_mixes_the_examples_is_refused_by_name(attn):
    model = tiny_model("llama", attn=attn)
    assert probe_packing(model).passed  # as built it packs exactly; the layer below is the only leak
    model.model.layers[1].mlp = _LeakingMLP(model.model.layers[1].mlp)
    assert _packed_vs_alone(model) > EXACT
    with pytest.raises(ValueError, match=r"attend to each other; the first layer whose output moved: .*_RowMean"):
        check_packing_support(model)
    report = probe_packing(model)
    assert report.leak > 0 and not report.passed and "_RowMean" in report.culprit


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
    from packing_collators.checks import synthetic_tokens

    model = tiny_model("llama", eos_token_id=[2, 3], bos_token_id=1)
    tokens = np.concatenate(synthetic_tokens(model.config, [50, 50], seed=0))
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


@pytest.fixture
def varlen_on_cpu(monkeypatch):
    """``packing_varlen`` (a kernel that reads cu_seq_lens) with a CPU reference kernel standing in for CUDA's."""
    from _tiny_models import reference_varlen_attn

    from packing_collators import register_varlen_attention
    from packing_collators.attention import _varlen

    register_varlen_attention()
    kernel = {"fn": reference_varlen_attn}
    monkeypatch.setattr(_varlen, "_load_varlen_attn", lambda query: kernel["fn"])
    return kernel


def _count_forwards(model) -> list:
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


def test_under_a_varlen_kernel_two_forwards_suffice_and_pass(varlen_on_cpu):
    # the alone run is a copy of the last example in front of the packed row, so the probe runs
    # two forwards (packed, leak) instead of three: a third of its cost on a GPU
    model = tiny_model("llama", attn="packing_varlen")
    forwards = _count_forwards(model)
    report = probe_packing(model)
    assert report.passed and report.leak == 0.0 and report.max_difference < 1e-5, report.summary()
    assert len(forwards) == 2
    assert len(_count_forwards(tiny_model("llama"))) == 0 and probe_packing(tiny_model("llama")).passed


def test_under_a_varlen_kernel_a_kernel_that_ignores_cu_seq_lens_leaks(varlen_on_cpu):
    from _tiny_models import reference_varlen_attn

    def one_sequence(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kwargs):
        whole = torch.tensor([0, query.shape[0]], dtype=torch.int32)
        return reference_varlen_attn(query, key, value, whole, whole, query.shape[0], query.shape[0], **kwargs)

    varlen_on_cpu["fn"] = one_sequence
    report = probe_packing(tiny_model("llama", attn="packing_varlen"))
    assert report.leak > 0 and not report.passed, report.summary()


class _RowPositions(FlatteningCollator):
    """A collator whose position_ids run across the whole row (what a model that ignores them would see)."""

    def __call__(self, features):
        batch = super().__call__(features)
        batch["position_ids"] = torch.arange(batch["input_ids"].shape[1])[None]
        return batch


def test_under_a_varlen_kernel_positions_that_run_across_the_row_are_caught(varlen_on_cpu):
    # the kernel keeps the examples apart (no leak), but the last example's learned position embeddings
    # start at 21, not 0: the copy of it in front of the row, at 0..8, is what it is compared with.
    # (RoPE is relative, so a Llama would not care; GPT-2 adds absolute position embeddings.)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64, use_cache=False)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="packing_varlen")
    assert probe_packing(gpt2).passed  # positions that restart: accepted
    report = probe_packing(gpt2, _RowPositions())
    assert report.leak == 0.0 and report.max_difference > report.tolerance and not report.passed, report.summary()


@pytest.fixture
def one_process_group():
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_an_fsdp1_wrapped_model_is_checked_inside_and_probed_through_its_wrapper(one_process_group):
    # measured on 2 H100s: under FSDP version 1 the static check read the wrapper's forward(*args, **kwargs)
    # and refused a Llama ("FullyShardedDataParallel.forward takes no position_ids"); the probe must still
    # run through the wrapper, whose forward gathers the sharded parameters
    from torch.distributed.fsdp import FullyShardedDataParallel

    wrapped = FullyShardedDataParallel(tiny_model("llama"), device_id=torch.device("cpu"), use_orig_params=True)
    batch = FlatteningCollator()([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    assert check_packing_support(wrapped, batch) == "sdpa"

    from packing_collators._model_unwrap import probe_module, unwrap_model

    assert type(unwrap_model(wrapped)).__name__ == "LlamaForCausalLM"
    assert probe_module(wrapped) is wrapped
