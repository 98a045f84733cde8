"""The architecture sweep on a few representative causal LMs: whatever check_packing_support accepts packs exactly.

The full sweep (every causal LM of transformers, ``benchmarks/_architectures.py``) takes minutes;
this runs its functions on ten architectures that span the ways examples are kept apart or not:
rotary (llama, gpt_neox, phi), learned absolute positions (gpt2), ALiBi (falcon), sliding windows
and softcapping (gemma2), positions from the attention mask (opt), bidirectional encoders used as
decoders (bert), a state-space model (mamba) and a hybrid (Granite-4.0-H: refused as built, exact
once ``enable_packing`` prepared it).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import _architectures as sweep  # noqa: E402  (benchmarks/_architectures.py: the sweep's rows)

ACCEPTED = ("llama", "gpt2", "gpt_neox", "phi", "falcon", "gemma2")
REFUSED = ("opt", "bert", "mamba")  # opt numbers positions from the attention mask; bert is bidirectional
HYBRID = ("granitemoehybrid",)  # Mamba2 and an attention layer whose mask ignores the packed positions


@pytest.fixture(scope="module")
def rows():
    classes = dict(sweep.causal_lm_classes(list(ACCEPTED + REFUSED + HYBRID)))
    out = []
    with sweep.quiet(), sweep.uncompiled_flex():
        for model_type in ACCEPTED + REFUSED + HYBRID:
            out += sweep.sweep_model(model_type, classes[model_type])
    return out


@pytest.mark.slow
def test_every_accepted_row_packs_to_the_padded_loss(rows):
    accepted = [r for r in rows if r["verdict"] == "accepted"]
    assert {r["model_type"] for r in accepted if not r["prepared"]} == set(ACCEPTED)  # the checks accept what they should
    for r in accepted:
        assert r["loss_difference"] <= sweep.WRONG, r
    assert sweep.summarise(rows)["accepted_and_wrong"] == 0


@pytest.mark.slow
def test_models_whose_packed_loss_is_wrong_are_refused(rows):
    for r in rows:
        if r["model_type"] in REFUSED and r["verdict"] != "not supported":
            assert r["verdict"] == "refused", r
            if r["prepared"]:  # Mamba prepared packs exactly; its forward still takes no position_ids (static check)
                assert r["loss_difference"] <= sweep.WRONG, r
            else:
                assert r["loss_difference"] > sweep.WRONG, r  # and they were right to refuse
    opt = [r for r in rows if r["model_type"] == "opt"]
    assert [r["attention"] for r in opt] == list(sweep.ATTENTIONS)
    assert all(r["reason"].startswith("probe: leak") and "OPTAttention" in r["reason"] for r in opt)
    mamba = [r for r in rows if r["model_type"] == "mamba" and r["verdict"] == "refused"]
    assert mamba and mamba[0]["reason"].startswith("static: MambaForCausalLM.forward takes no position_ids")


@pytest.mark.slow
def test_no_row_errors_and_every_implementation_is_reported(rows):
    assert not [r for r in rows if r["verdict"] in ("error", "cannot build")]
    for model_type in ACCEPTED + REFUSED + HYBRID:
        for prepared in (False, True):
            attentions = [r["attention"] for r in rows if r["model_type"] == model_type and r["prepared"] == prepared]
            assert attentions in ([], list(sweep.ATTENTIONS)), (model_type, prepared)


@pytest.mark.slow
def test_a_hybrid_is_refused_as_built_and_exact_once_prepared(rows):
    for model_type in HYBRID:
        built = [r for r in rows if r["model_type"] == model_type and not r["prepared"]]
        prepared = [r for r in rows if r["model_type"] == model_type and r["prepared"]]
        assert built and all(r["verdict"] in ("refused", "not supported") for r in built), built
        assert [r["verdict"] for r in prepared if r["attention"] in ("eager", "sdpa")] == ["accepted", "accepted"]
        assert all(r["loss_difference"] <= sweep.WRONG for r in prepared if r["verdict"] == "accepted")


def test_tiny_configs_keep_one_layer_per_kind():
    # Gemma 3 alternates five sliding-window layers and one full one over 26: the tiny model keeps one of each.
    config = sweep.tiny_config("gemma3_text")
    assert config.num_hidden_layers == 2 and config.layer_types == ["sliding_attention", "full_attention"]
    assert (config.hidden_size, config.vocab_size, config.sliding_window, config.use_cache) == (32, 128, 4, False)
    llama = sweep.tiny_config("llama")  # no per-layer lists: two layers
    assert (llama.num_hidden_layers, llama.num_attention_heads, llama.num_key_value_heads) == (2, 4, 2)


def test_a_model_that_cannot_be_built_tiny_is_a_row_not_a_gap(monkeypatch):
    def fail(model_type, class_name, *, seed=0):
        raise RuntimeError("no tiny size for this one")

    monkeypatch.setattr(sweep, "build_tiny", fail)
    (row,) = sweep.sweep_model("llama", "LlamaForCausalLM")
    assert (
        row["verdict"] == "cannot build"
        and row["reason"] == "cannot build tiny: RuntimeError: no tiny size for this one"
    )
    assert sweep.summarise([row]) == {
        "verdicts": {"cannot build": 1},
        "accepted_and_wrong": 0,
        "refused_with_loss_difference_under_1e-5": 0,
        "rows": 1,
    }


def test_uncompiled_flex_restores_what_it_replaced():
    from transformers import masking_utils
    from transformers.integrations import flex_attention

    before = flex_attention.compile_friendly_flex_attention, masking_utils.create_block_mask
    with sweep.uncompiled_flex():
        assert flex_attention.compile_friendly_flex_attention is not before[0]
    assert (flex_attention.compile_friendly_flex_attention, masking_utils.create_block_mask) == before
