"""Mixture-of-experts models under the probe: routed experts run one token at a time, so batch composition
cannot round the leak test, while a leak anywhere (attention, router, experts beyond rounding) is still refused.

The models are routed as their checkpoints are (8 experts, 2 per token; ``tests/_moes.py``). Run batched,
changing one example changes how many tokens each expert multiplies, which moves the other examples'
logits by float32 rounding (1e-8 to 3e-6 on a CPU): every one of these types was refused for it.
"""

from __future__ import annotations

import pytest
import torch
from _hybrids import alone_logits, examples_for
from _moes import MOES, tiny_moe
from _tiny_models import causal_over_whole_row

from packing_collators import FlatteningCollator, check_packing_support, enable_packing
from packing_collators.checks import probe_packing

transformers = pytest.importorskip("transformers")


def _prepared(model_type: str):
    model = enable_packing(tiny_moe(model_type))
    model.config.use_cache = False
    return model


@pytest.mark.parametrize("model_type", sorted(MOES))
def test_moe_models_routed_as_checkpoints_are_accepted_and_exact(model_type):
    model = _prepared(model_type)
    examples = examples_for(model)
    batch = FlatteningCollator()(examples)
    assert check_packing_support(model, batch) == "sdpa"
    report = probe_packing(model)
    assert report.leak == 0.0 and report.experts, report.summary()
    assert report.experts_rounding <= report.experts_tolerance, report.summary()
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        alone = alone_logits(model, examples)
    assert float((packed - alone).abs().max()) < 1e-5


@pytest.mark.parametrize("model_type", [t for t in ("qwen3_moe", "mixtral", "nemotron_h") if t in MOES])
def test_a_moe_model_whose_attention_ignores_the_examples_is_refused(model_type, monkeypatch):
    model = _prepared(model_type)
    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "sdpa", causal_over_whole_row)
    # the cause named is the attention (enable_packing prepared the model, but no unknown layer mixes it)
    moved = r"attend to each other; the first layer whose output moved: \S+ \(\w+Attention\)\. "
    with pytest.raises(ValueError, match=moved + r"\w+'s 'sdpa' attention does not keep the examples apart"):
        check_packing_support(model)
    report = probe_packing(model)
    assert report.leak > 1e-3 and report.experts_rounding <= report.experts_tolerance, report.summary()


def test_a_router_that_reads_other_tokens_is_refused():
    # routing runs over the whole row, as training runs it: a router whose choice depends on the
    # other tokens (here their mean) moves the other examples' weights, and the leak test sees it
    model = _prepared("qwen3_moe")
    gate = model.model.layers[0].mlp.gate

    class RowRouter(type(gate)):
        def forward(self, hidden_states):
            hidden_states = hidden_states.reshape(-1, self.hidden_dim)
            return super().forward(hidden_states + hidden_states.mean(0))

    gate.__class__ = RowRouter
    with pytest.raises(ValueError, match=r"the first layer whose output moved: model.layers.0.mlp.gate \(RowRouter\)"):
        check_packing_support(model)


def test_routed_experts_that_mix_tokens_are_refused_by_name():
    model = _prepared("qwen3_moe")
    experts = model.model.layers[0].mlp.experts

    class MixingExperts(type(experts)):
        def forward(self, hidden_states, top_k_index, top_k_weights):
            return super().forward(hidden_states, top_k_index, top_k_weights) + 0.1 * hidden_states.mean(0)

    experts.__class__ = MixingExperts
    with pytest.raises(
        ValueError, match=r"routed experts compute a token differently .*model.layers.0.mlp.experts \(MixingExperts\)"
    ):
        check_packing_support(model)
    assert "forward" not in vars(experts)  # the per-token forward is gone once the probe returns


def test_jetmoe_is_accepted_where_it_packs_exactly_and_named_where_rounding_moves_it():
    # JetMoE's mixture-of-attention heads route tokens like experts, outside transformers' experts interface, so the
    # probe runs them batched. Whether the other examples then move by float32 rounding depends on the CPU's kernels
    # (they moved on the machines this test was written on, and stay bit-equal on an AVX-512/AMX one): either way the
    # verdict must follow the measure
    from _hybrids import sweep
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if "jetmoe" not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        pytest.skip("this transformers has no JetMoE")
    model = sweep.build_tiny("jetmoe", MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["jetmoe"])
    report = probe_packing(model)
    assert report.leak <= report.tolerance, report.summary()  # never beyond rounding
    if report.leak == 0:  # no example moved: packing is exact here, and refusing it would be a defect
        assert check_packing_support(model) == "sdpa"
    else:  # which of its two routed layers moves first is float32 rounding (the BLAS thread count)
        named = r"\(JetMoe(Attention|MoE)\)\), within rounding .*cannot tell the two apart"
        with pytest.raises(ValueError, match=named):
            check_packing_support(model)


def test_a_leak_within_rounding_is_refused_and_the_layer_named_on_any_cpu():
    # the refusal JetMoE meets on CPUs whose kernels round by batch composition, made on purpose: a layer that moves
    # the other examples by about 1e-7 of its output, far inside the probe's rounding tolerance
    from _tiny_models import tiny_model

    model = tiny_model("llama")
    down = model.model.layers[0].mlp.down_proj

    class FaintlyMixing(type(down)):
        def forward(self, hidden_states):
            out = super().forward(hidden_states)
            return out + 1e-7 * out.mean(dim=-2, keepdim=True)  # every token sees the row's mean: a faint leak

    down.__class__ = FaintlyMixing
    report = probe_packing(model)
    assert 0 < report.leak <= report.tolerance, report.summary()
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.down_proj \(FaintlyMixing\)\), within rounding .*"
                                         r"cannot tell the two apart"):  # fmt: skip
        check_packing_support(model)
