"""The architecture sweep on a few representative causal LMs: whatever check_packing_support accepts packs exactly.

The full sweep (every causal LM of transformers, ``benchmarks/_architectures.py``) takes minutes;
this runs its functions on ten architectures that span the ways examples are kept apart or not:
rotary (llama, gpt_neox, phi), learned absolute positions (gpt2), ALiBi (falcon), sliding windows
and softcapping (gemma2), positions from the attention mask (opt), encoders used as decoders (bert),
a state-space model (mamba) and a hybrid (Granite-4.0-H). The verdicts are measured, not listed: every
accepted row packs to the padded loss, every row whose packed loss differs is refused and no exact one is,
so a transformers release that fixes or breaks a model changes the verdict, not the test.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import _architectures as sweep  # noqa: E402  (benchmarks/_architectures.py: the sweep's rows)

# Architectures that span the ways examples are kept apart or not. No verdict is held here: what was seen, for the
# record (transformers 5.25): accepted llama, gpt2, gpt_neox, phi, falcon, gemma2, bert (5.15-5.24 refused it);
# refused opt (positions from the attention mask; the probe names OPTAttention); mamba and granitemoehybrid refused
# as built (layers that carry state) and exact, so accepted, once enable_packing prepared them.
TYPES = ("llama", "gpt2", "gpt_neox", "phi", "falcon", "gemma2", "opt", "bert", "mamba", "granitemoehybrid")
STATEFUL = ("mamba", "granitemoehybrid")  # layers that carry state along the sequence: what enable_packing prepares


@pytest.fixture(scope="module")
def rows():
    classes = dict(sweep.causal_lm_classes(list(TYPES)))
    out = []
    with sweep.quiet(), sweep.uncompiled_flex():
        for model_type in TYPES:
            out += sweep.sweep_model(model_type, classes[model_type])
    return out


def _measured(rows):
    return [r for r in rows if r["verdict"] in ("accepted", "refused") and r["loss_difference"] is not None]


@pytest.mark.slow
def test_every_accepted_row_packs_to_the_padded_loss(rows):
    accepted = [r for r in _measured(rows) if r["verdict"] == "accepted"]
    assert {r["model_type"] for r in accepted} >= {"llama", "gpt2"}  # the sweep measured something to accept
    for r in accepted:
        assert r["loss_difference"] <= sweep.WRONG, r
    assert sweep.summarise(rows)["accepted_and_wrong"] == 0


@pytest.mark.slow
def test_every_row_whose_packed_loss_differs_is_refused_and_no_exact_row_is(rows):
    for r in _measured(rows):
        assert (r["verdict"] == "refused") == (r["loss_difference"] > sweep.WRONG), r
    assert [r for r in rows if r["verdict"] == "refused"]  # the sweep measured something to refuse
    for r in rows:  # a refusal says why: the static check's cause, or the probe's numbers and the layer that moved
        if r["verdict"] == "refused":
            assert r["reason"].startswith(("static: ", "probe: ")), r
            if r["reason"].startswith("probe: leak") and not r["reason"].startswith("probe: leak 0;"):
                assert " in " in r["reason"], r  # the first layer whose output moved, by name


@pytest.mark.slow
def test_no_row_errors_and_every_implementation_is_reported(rows):
    assert not [r for r in rows if r["verdict"] in ("error", "cannot build")]
    for model_type in TYPES:
        for prepared in (False, True):
            attentions = [r["attention"] for r in rows if r["model_type"] == model_type and r["prepared"] == prepared]
            assert attentions in ([], list(sweep.ATTENTIONS)), (model_type, prepared)


@pytest.mark.slow
def test_layers_that_carry_state_are_refused_as_built_with_the_fix(rows):
    for model_type in STATEFUL:
        built = [r for r in rows if r["model_type"] == model_type and not r["prepared"] and r["verdict"] == "refused"]
        assert built and all("enable_packing" in r["reason"] or "carry state" in r["reason"] for r in built), built
        assert [r for r in rows if r["model_type"] == model_type and r["prepared"]]  # and measured once prepared


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
