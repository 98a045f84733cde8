"""FA4's warm-up runs the model once and replays its attention calls alone: the kernel meets the same configurations.

FA4 compiles a variant per configuration: everything its varlen function is passed but the tensors' values. Here a
stand-in kernel notes that configuration at every call (dtypes, head shapes, the layout's lengths, causal, window,
softcap, sinks, determinism, scale). Measured: the configurations a replayed warm-up passes equal those of running the
whole model for every layout, on a grouped-query Llama under the Trainer's bf16 autocast and on
Gemma-2 (softcapped attention, sliding-window layers between full ones, windows that bind only past their length).
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import tiny_model

from packing_collators import register_fa4_attention
from packing_collators.attention import _fa4, _warm_up


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
    monkeypatch.setattr(_warm_up, "replays_the_model", lambda recording, model: False)
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


def test_compiled_layers_calls_through_the_custom_op_replay_as_the_model_would_make_them(monkeypatch):
    # compile_layers: each layer calls FA4 through the custom op, which records the call with the window the layer
    # worked out; the replays go through the same op, forward and backward
    from _tiny_models import reference_fa4_interface

    from packing_collators.attention import _fa4_ops
    from packing_collators.models import compile_layers

    forward, backward = reference_fa4_interface()
    seen = []

    def noting(q, k, v, **kwargs):
        options = {k: v for k, v in kwargs.items() if k not in ("cu_seqlens_q", "cu_seqlens_k", "learnable_sink")}
        seen.append((q.dtype, q.shape, k.shape, tuple(kwargs["cu_seqlens_q"].tolist()), *sorted(options.items())))
        return forward(q, k, v, **kwargs)

    register_fa4_attention()
    monkeypatch.setattr(_fa4_ops, "_interface", lambda: (noting, backward))
    monkeypatch.setattr(_fa4, "_kernel", lambda query: pytest.fail("a compiled layer calls the custom op"))
    model = tiny_model("llama", attn="packing_fa4", num_hidden_layers=2).bfloat16()
    assert compile_layers(model, backend="aot_eager") == 2
    layouts = _warm_up.warm_up_layouts(40, tokens=80, most_sequences=10)
    passes = []
    through = _warm_up._backward_through_layers
    monkeypatch.setattr(_warm_up, "_backward_through_layers", lambda *a, **k: passes.append(1) or through(*a, **k))

    recording = _warm_up.run_warm_up(model, layouts)
    replayed, model_passes = set(seen), len(passes)
    seen.clear(), passes.clear()
    monkeypatch.setattr(_warm_up, "replays_the_model", lambda recording, model: False)
    _warm_up.run_warm_up(model, layouts)

    assert {c.route for c in recording.calls} == {"op"} and recording.layer_count == 2
    assert replayed == set(seen) and model_passes == 1 and len(passes) == len(layouts) > 3


def test_a_compiled_calls_unknown_window_is_replayed_only_where_the_model_has_no_sliding_window():
    from packing_collators.attention._fa4_replay import FA4Call, Recording

    unbound = FA4Call(torch.bfloat16, torch.device("cpu"), 4, 2, 8, 8, None, True, None, 0.0, False, None, "op", True)
    recording = Recording(calls={unbound}, op_calls=2)
    llama, mistral = tiny_model("llama"), tiny_model("mistral", sliding_window=64)
    assert _warm_up.replays_the_model(recording, llama)  # no window anywhere: none it is
    assert not _warm_up.replays_the_model(recording, mistral)  # a window of 64 not bound by the recorded layout
    bound = FA4Call(*[getattr(unbound, f) for f in ("dtype", "device", "heads", "kv_heads", "head_dim", "head_dim_v",
                                                    "scale", "causal")], 64, 0.0, False, None, "op")  # fmt: skip
    assert _warm_up.replays_the_model(Recording(calls={bound}, op_calls=2), mistral)
    assert not _warm_up.replays_the_model(Recording(calls={bound}, op_calls=1), mistral)  # one layer of two


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
