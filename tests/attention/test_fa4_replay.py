"""FA4's warm-up runs the model once and replays its attention calls alone: the kernel meets the same configurations.

FA4 compiles a variant per configuration: everything its varlen function is passed but the tensors' values. Here a
stand-in kernel notes that configuration at every call (dtypes, head shapes, the layout's lengths, causal, window,
softcap, sinks, determinism, scale). Measured: the configurations a replayed warm-up passes equal those of running the
whole model for every layout (the warm-up before), on a grouped-query Llama under the Trainer's bf16 autocast and on
Gemma-2 (softcapped attention, sliding-window layers between full ones, windows that bind only past their length).
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import tiny_model

from packing_collators import register_fa4_attention
from packing_collators.attention import _fa4, _fa4_replay, _warm_up


def configuration(q, k, v, **kwargs) -> tuple:
    cu_q, cu_k = kwargs.pop("cu_seqlens_q"), kwargs.pop("cu_seqlens_k")
    sink = kwargs.pop("learnable_sink")
    return (
        q.dtype, k.dtype, v.dtype, q.shape, k.shape, v.shape, tuple(cu_q.tolist()), tuple(cu_k.tolist()),
        None if sink is None else (sink.shape, sink.dtype), *sorted(kwargs.items()),
    )  # fmt: skip


@pytest.fixture
def kernel(monkeypatch):
    seen = []

    def stand_in(q, k, v, **kwargs):
        seen.append(configuration(q, k, v, **kwargs))
        return q * 2.0, None  # differentiable in q: the backward runs

    register_fa4_attention()
    monkeypatch.setattr(_fa4, "_kernel", lambda query: stand_in)
    return seen


def gemma2():
    from transformers import AutoModelForCausalLM, Gemma2Config

    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=8, sliding_window=40, attn_logit_softcapping=50.0)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="packing_fa4", dtype=torch.float32).train()


@pytest.mark.parametrize("make", [lambda: tiny_model("llama", attn="packing_fa4"), gemma2], ids=["llama", "gemma2"])
def test_replaying_the_recorded_calls_meets_every_configuration_running_the_model_for_each_layout_does(
    make, kernel, monkeypatch
):
    model, autocast = make(), torch.autocast("cpu", dtype=torch.bfloat16)
    layouts = _warm_up.warm_up_layouts(100, tokens=200, most_sequences=None)
    passes = []
    through = _warm_up._backward_through_layers
    monkeypatch.setattr(_warm_up, "_backward_through_layers", lambda *a, **k: passes.append(1) or through(*a, **k))

    recording = _warm_up.run_warm_up(model, layouts, autocast=autocast)
    replayed, model_passes = set(kernel), len(passes)
    kernel.clear(), passes.clear()
    monkeypatch.setattr(_fa4_replay.Recording, "replayable", property(lambda self: False))
    _warm_up.run_warm_up(model, layouts, autocast=autocast)

    assert replayed == set(kernel) and len({c[6] for c in replayed}) == len(layouts)  # every layout, as the model
    assert model_passes == 1 and len(passes) == len(layouts) > 10
    assert all(p.grad is None for p in model.parameters())
    windows = {dict(c[9:])["window_size"] for c in replayed}
    if make is gemma2:  # two calls recorded (sliding and full layers); the window binds past 40 tokens only
        assert len(recording.calls) == 2 and windows == {(None, None), (39, 0)}
        assert {dict(c[9:])["softcap"] for c in replayed} == {50.0}
    else:
        assert len(recording.calls) == 1 and windows == {(None, None)}
    assert {c[0] for c in replayed} == {torch.bfloat16}  # the Trainer's autocast, float32 weights


def test_a_compiled_layers_call_is_not_replayed_the_model_runs_each_layout(monkeypatch):
    from _tiny_models import tiny_model

    passes = []
    monkeypatch.setattr(_warm_up, "_backward_through_layers", lambda model, batch, autocast=None: passes.append(1)
                        or _fa4_replay.note_traced_call())  # fmt: skip  (what the custom op does under compile)
    layouts = _warm_up.warm_up_layouts(64, tokens=128)
    recording = _warm_up.run_warm_up(tiny_model("llama"), layouts)
    assert not recording.replayable and len(passes) == len(layouts)


def test_a_replayable_recording_skips_the_model_pass(kernel, monkeypatch):
    model = tiny_model("llama", attn="packing_fa4")
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    recording = _warm_up.run_warm_up(model, [[20, 20]], autocast=autocast)
    monkeypatch.setattr(_warm_up, "_backward_through_layers", lambda *a, **k: pytest.fail("the model ran again"))
    kernel.clear()
    _warm_up.run_warm_up(model, [[70], [33, 10]], autocast=autocast, recording=recording)
    assert sorted(c[6] for c in kernel) == [(0, 33, 43), (0, 70)]


def test_a_hybrid_runs_every_layout_through_the_model_its_other_layers_kernels_warm_as_before(kernel, monkeypatch):
    # Gated DeltaNet layers between the attention ones run kernels of their own (fla's, on a GPU): the recording
    # stands for the attention layers only, so the warm-up keeps running the whole model for every layout
    from _hybrids import HYBRIDS, tiny_hybrid

    if "qwen3_5_text" not in HYBRIDS:
        pytest.skip("this transformers has no Qwen3.5")  # the installed transformers (5.25) has it
    from packing_collators import enable_packing

    model = enable_packing(tiny_hybrid("qwen3_5_text", attn="packing_fa4").train())  # the linear layers, packed
    passes = []
    through = _warm_up._backward_through_layers
    monkeypatch.setattr(_warm_up, "_backward_through_layers", lambda *a, **k: passes.append(1) or through(*a, **k))
    layouts = _warm_up.warm_up_layouts(40, tokens=80, most_sequences=10)
    recording = _warm_up.run_warm_up(model, layouts, autocast=torch.autocast("cpu", dtype=torch.bfloat16))
    attention_layers = sum(t == "full_attention" for t in model.config.layer_types)
    assert 0 < len(recording.layers) == attention_layers < model.config.num_hidden_layers
    assert len(passes) == len(layouts) > 1
