"""PackingTrainer(compile_layers=...): "auto" compiles the decoder layers in place on a CUDA GPU, and leaves
quantized models, PEFT adapters and CPU runs eager with the reason; True refuses where layers cannot compile;
False trains eager (and ``torch_compile=True`` then compiles the whole model).

On the CPU, "auto" is put where it would compile by replacing ``auto_compile_blocker`` (the CUDA, quantization,
PEFT and Inductor checks, tested here one by one where a CPU can); the layers then compile with Dynamo's "eager"
backend set on the arguments after construction (TrainingArguments turns ``torch_compile`` on for a backend given
to it), the graphs Dynamo traces, without Inductor's code generation.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import pytest
import torch
from _tiny_models import random_examples, tiny_model

from packing_collators import PackingTrainer
from packing_collators.models import compiled_layer_count
from packing_collators import models
from packing_collators.models import _compile_layers
from packing_collators.trainer import _compile
from packing_collators.trainer._head_loss import why_full_logits

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _trainer(tmp_path, *, option="auto", backend="eager", mode=None, steps=2, probe=False, **arguments):
    from _tiny_models import training_args

    args = training_args(tmp_path / str(option), max_steps=steps, gradient_accumulation_steps=1, **arguments)
    args.torch_compile_backend, args.torch_compile_mode = backend, mode  # after __post_init__: torch_compile stays
    rng = np.random.default_rng(0)
    return PackingTrainer(model=tiny_model("llama"), args=args, train_dataset=random_examples(
        rng.integers(3, 30, 32).tolist()), max_tokens_per_batch=90, compile_layers=option,
        packing_probe=probe)  # fmt: skip  (the probe's own graphs are tests/trainer/test_compile.py's)


def _losses(trainer):
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_auto_on_a_cpu_trains_eager_and_says_why(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger=_compile.__name__):
        trainer = _trainer(tmp_path)
    assert not trainer._compile.enabled and compiled_layer_count(trainer.model) == 0
    assert "the layers train eager (compile_layers='auto'): the model does not train on a CUDA GPU" in caplog.text
    assert trainer.compile_report is None


@pytest.mark.slow  # Dynamo traces the tiny Llama: seconds
def test_auto_where_it_compiles_compiles_the_layers_before_the_first_step_and_trains_as_eager(tmp_path, monkeypatch):
    eager_trainer = _trainer(tmp_path, option=False)
    eager = _losses(eager_trainer)
    monkeypatch.setattr(models, "auto_compile_blocker", lambda model, device: "")  # a GPU that compiles
    trainer = _trainer(tmp_path)
    assert trainer._compile.enabled and trainer._compile.whole_model == ""
    layers = trainer.model.config.num_hidden_layers
    assert compiled_layer_count(trainer.model) == layers
    assert why_full_logits(trainer) == ""  # the loss stays chunked
    losses = _losses(trainer)
    report = trainer.compile_report
    assert report.buckets == (96,) and report.graphs >= 1 and report.recompiles == 0
    assert np.allclose(losses, eager, rtol=1e-4)  # float32: the compiled layers compute what the eager ones do
    # the logged metrics count real tokens and examples: the bucket's padding segment is padding, not an example
    logged = [h for h in trainer.state.log_history if "num_tokens" in h]
    plain = [h for h in eager_trainer.state.log_history if "num_tokens" in h]
    assert [h["num_tokens"] for h in logged] == [h["num_tokens"] for h in plain]
    assert [h["examples_per_step"] for h in logged] == [h["examples_per_step"] for h in plain]
    assert all(h["packing_efficiency"] <= 1 and h["padding_fraction"] > 0 for h in logged)


@pytest.mark.slow
def test_training_steps_trace_the_row_length_static_and_the_probe_keeps_its_graphs_apart(tmp_path, monkeypatch):
    from _graph_recorder import GraphRecorder
    from transformers import TrainerCallback

    eager = _losses(_trainer(tmp_path, option=False, steps=3))
    import packing_collators.models as models

    monkeypatch.setattr(models, "auto_compile_blocker", lambda model, device: "")
    recorder, first_step, compile_layers = GraphRecorder(), [], models.compile_layers
    # the layers compiled with the recording backend (accelerate takes only its named backends on the arguments)
    monkeypatch.setattr(models, "compile_layers", lambda model, backend, **k: compile_layers(model, backend=recorder,
                                                                                                **k))  # fmt: skip

    class FirstStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            first_step.append(len(recorder.calls))

    trainer = _trainer(tmp_path, steps=3, probe=True)
    trainer.add_callback(FirstStep())
    losses = _losses(trainer)
    trained = recorder.calls[first_step[0] :]  # the training steps' calls, after the probe's and the warm-up's
    assert trained and not any(recorder.graphs[i] for i in trained)  # rows padded to the bucket, traced static
    assert any(recorder.graphs)  # the probe's rows of their own lengths took dynamic graphs, which stay apart
    assert trainer.compile_report.recompiles == 0
    assert np.allclose(losses, eager, rtol=1e-4)


@pytest.mark.slow
def test_a_model_model_init_builds_anew_is_compiled_as_the_first_one(tmp_path, monkeypatch):
    from _tiny_models import training_args

    monkeypatch.setattr(models, "auto_compile_blocker", lambda model, device: "")
    args = training_args(tmp_path, max_steps=2, gradient_accumulation_steps=1)
    args.torch_compile_backend = "eager"
    built = []
    trainer = PackingTrainer(model_init=lambda *a: built.append(tiny_model("llama")) or built[-1], args=args,
                             train_dataset=random_examples([5, 9, 12, 7] * 4), max_tokens_per_batch=32, packing_probe=False)  # fmt: skip
    trainer.train()
    assert len(built) == 2 and trainer.model is built[-1]  # construction's model, then train()'s
    assert compiled_layer_count(built[-1]) == built[-1].config.num_hidden_layers and trainer._compile.enabled
    assert trainer.compile_report.graphs >= 1


def test_auto_decides_from_the_device_the_model_will_train_on():
    # a model still on the CPU (model_init's, place_model_on_device=False) that trains on a GPU: the GPU's checks
    # run (here, without a GPU, Inductor's fails), not "it is on the CPU"
    why = _compile_layers.auto_compile_blocker(tiny_model("llama"), torch.device("cuda"))
    assert why.startswith("torch.compile fails on this machine")


def test_auto_leaves_liger_runs_eager(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(models, "auto_compile_blocker", lambda model, device: "")
    trainer = _trainer(tmp_path, option=False)
    trainer._compile.option, trainer.args.use_liger_kernel = "auto", True
    with caplog.at_level(logging.INFO, logger=_compile.__name__):
        trainer._compile.compile_layers(trainer.model)
    assert compiled_layer_count(trainer.model) == 0 and not trainer._compile.enabled
    assert "Liger's kernels replace modules inside the layers" in caplog.text


def test_auto_leaves_quantized_and_adapter_models_eager():
    model = tiny_model("llama")
    model.is_quantized = True
    assert _compile_layers.auto_compile_blocker(model) == "the model is quantized"
    peft = pytest.importorskip("peft")
    adapted = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert _compile_layers.auto_compile_blocker(adapted) == "the model carries PEFT adapters"
    assert _compile_layers.auto_compile_blocker(tiny_model("llama")) == "the model does not train on a CUDA GPU"


def test_true_compiles_on_a_cpu_and_refuses_where_layers_cannot_compile(tmp_path):
    trainer = _trainer(tmp_path, option=True)
    assert trainer._compile.enabled and compiled_layer_count(trainer.model) == trainer.model.config.num_hidden_layers
    with pytest.raises(ValueError, match=r"compile_layers=True\): mode='reduce-overhead' replays CUDA graphs"):
        _trainer(tmp_path, option=True, mode="reduce-overhead")
    with pytest.raises(ValueError, match="compile_layers must be 'auto', True or False, got 'yes'"):
        _trainer(tmp_path, option="yes")


def test_false_trains_eager_and_torch_compile_then_compiles_the_whole_model(tmp_path):
    trainer = _trainer(tmp_path, option=False)
    assert not trainer._compile.enabled and compiled_layer_count(trainer.model) == 0
    compiled = _trainer(tmp_path, option=True)  # a model whose layers an earlier trainer compiled
    again = PackingTrainer(model=compiled.model, args=compiled.args, train_dataset=compiled.train_dataset,
                           max_tokens_per_batch=90, compile_layers=False)  # fmt: skip
    assert compiled_layer_count(again.model) == 0 and not again._compile.enabled
    whole = _trainer(tmp_path, option=False, torch_compile=True, torch_compile_backend="eager")
    assert whole._compile.enabled and compiled_layer_count(whole.model) == 0
    assert whole._compile.whole_model == "compile_layers=False"
    assert "torch_compile=True compiles the whole model (compile_layers=False)" in why_full_logits(whole)
    whole.get_train_dataloader()  # padded to the bucket, but a model compiled whole traces its own shapes
    assert whole.compile_report.buckets == (96,) and not whole.compile_report.static_rows
    assert isinstance(whole._compile.training_rows(), contextlib.nullcontext)


def test_uncompile_layers_gives_back_the_eager_forward():
    model = tiny_model("llama")
    layer = model.model.layers[0]
    assert _compile_layers.compile_layers(model, backend="eager") == model.config.num_hidden_layers
    assert "forward" in vars(layer)
    assert _compile_layers.uncompile_layers(model) == model.config.num_hidden_layers
    assert "forward" not in vars(layer) and compiled_layer_count(model) == 0
    inputs = torch.arange(1, 9)[None]
    assert torch.equal(model(inputs).logits, model(inputs).logits)  # runs eager, deterministic


AGREE = r"""
import sys
sys.path.insert(0, {tests!r})
import torch.distributed as dist
from packing_collators.trainer._compile import _agreed

dist.init_process_group("gloo")
rank = dist.get_rank()
why = _agreed("no Triton here" if rank == 1 else "", "cpu")
both = _agreed("", "cpu")
open(sys.argv[1] + f"/rank{{rank}}.txt", "w").write(repr((why, both)))
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_every_process_of_a_job_decides_alike(tmp_path):
    # a process left eager would skip the warm-up steps the others run through DDP's collectives, and hang them
    from _two_ranks import run_two_ranks

    run_two_ranks(AGREE, tmp_path, timeout=120)
    zero, one = (eval((tmp_path / f"rank{r}.txt").read_text()) for r in range(2))
    assert zero == ("another process of the job cannot compile its layers (its log says why)", "")
    assert one == ("no Triton here", "")


def test_a_compiled_step_is_tried_and_leaves_the_random_state_and_gradients_alone():
    model = tiny_model("llama")
    _compile_layers.compile_layers(model, backend="eager")
    state = torch.random.get_rng_state()
    assert _compile_layers.compiled_step_failure(model, devices=("cpu",)) == ""
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())

    class BrokenBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("backward broke")

    last = model.model.layers[-1]
    eager_forward = type(last).forward
    last.forward = (lambda self, *a, **k: BrokenBackward.apply(eager_forward(self, *a, **k))).__get__(last)
    assert _compile_layers.compiled_step_failure(model, devices=("cpu",)) == (
        "a compiled step failed (RuntimeError: backward broke)"  # the backward runs through the layers
    )

    def broken(self, *args, **kwargs):
        raise RuntimeError("no C compiler\nmore lines")

    for layer in model.model.layers:
        layer.forward = broken.__get__(layer)
    why = _compile_layers.compiled_step_failure(model, devices=("cpu",))
    assert why == "a compiled step failed (RuntimeError: no C compiler)"
    assert all(p.grad is None for p in model.parameters())


def test_the_tried_step_autocasts_as_training_does(monkeypatch):
    # float32 weights with bf16=True (mixed precision's usual set-up): FA4 takes half activations only, which
    # training's autocast gives it; a step tried without it fails, and "auto" would train eager for nothing
    from _tiny_models import half_only

    from packing_collators import register_fa4_attention
    from packing_collators.attention import _fa4

    register_fa4_attention()
    monkeypatch.setattr(_fa4, "_kernel", half_only)  # the kernel's dtype rule, a CPU stand-in behind it
    model = tiny_model("llama", attn="packing_fa4")
    _compile_layers.compile_layers(model, backend="eager")
    assert model.dtype == torch.float32
    why = _compile_layers.compiled_step_failure(model, devices=("cpu",))
    assert why.startswith("a compiled step failed (AssertionError: FA4 got torch.float32")
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    assert _compile_layers.compiled_step_failure(model, devices=("cpu",), autocast=autocast) == ""


def test_auto_tries_its_step_under_the_trainers_autocast(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(models, "auto_compile_blocker", lambda model, device: "")
    monkeypatch.setattr(models, "compiled_step_failure",
                        lambda model, autocast=None: seen.append(autocast) or "stop here")  # fmt: skip
    _trainer(tmp_path, bf16=True)
    _trainer(tmp_path / "fp32")
    assert [type(a).__name__ for a in seen] == ["autocast", "NoneType"] and seen[0].fast_dtype == torch.bfloat16


def test_auto_trains_eager_where_the_tried_step_fails(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(models, "auto_compile_blocker", lambda model, device: "")
    monkeypatch.setattr(models, "compiled_step_failure",
                        lambda model, autocast=None: "a compiled step failed (BackendCompilerFailed: no C compiler)")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=_compile.__name__):
        trainer = _trainer(tmp_path, steps=3)
    assert not trainer._compile.enabled and compiled_layer_count(trainer.model) == 0
    assert "train eager (compile_layers='auto'): a compiled step failed (BackendCompilerFailed" in caplog.text
    assert len(_losses(trainer)) == 3 and trainer.compile_report is None


@pytest.mark.parametrize("version, expected", [(2, ""), (1, "FSDP version 1 flattens the layers' parameters")])
def test_under_fsdp2_the_layers_compile_and_under_fsdp1_the_reason_is_given(tmp_path, monkeypatch, version, expected):
    # accelerate's FSDP needs a GPU: the trainer's FSDP state is set as accelerate sets it there (the gradients under
    # FSDP2 against eager: tests/models/test_compile_layers_fsdp.py)
    from accelerate import Accelerator

    trainer = _trainer(tmp_path, option=False)
    monkeypatch.setattr(Accelerator, "is_fsdp2", property(lambda self: version == 2))
    trainer.is_fsdp_enabled = True
    why = _compile.compile_trainer_layers(trainer, trainer.model, only_check=True)
    assert why.startswith(expected) and bool(why) == (version == 1)
    if version == 2:
        assert _compile.compile_trainer_layers(trainer, trainer.model) == ""
        assert compiled_layer_count(trainer.model) == trainer.model.config.num_hidden_layers


@pytest.mark.parametrize("plugin, in_graph", [
    (dict(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["LlamaDecoderLayer"]), True),
    (dict(auto_wrap_policy="transformer_based_wrap"), True),  # the model's _no_split_modules: its decoder layers
    (dict(auto_wrap_policy="transformer_based_wrap", activation_checkpointing_offload=True), False),  # save_on_cpu
    (dict(auto_wrap_policy="size_based_wrap", min_num_params=10), False),  # wraps more than the layers
])  # fmt: skip
def test_under_fsdp2_checkpointing_moves_into_the_layers_graphs_where_accelerate_would_wrap_only_them(
    tmp_path, monkeypatch, plugin, in_graph
):
    # fsdp_config activation_checkpointing: the checkpoint compiled into each layer's graph, accelerate's wrapper kept
    # off while it prepares this model and restored after (its plugin is shared by the process's Trainers); where
    # accelerate would wrap other modules too, or offload what it saves, its own wrapper stays (around the layers)
    from accelerate import Accelerator
    from accelerate.utils import DynamoBackend, FullyShardedDataParallelPlugin

    trainer = _trainer(tmp_path, option=False)
    plugin = dict(plugin)
    offload = plugin.pop("activation_checkpointing_offload", None)  # accelerate 1.15's option (1.14 has none)
    fsdp = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True, **plugin)
    if offload is not None:
        fsdp.activation_checkpointing_offload = offload
    monkeypatch.setattr(Accelerator, "is_fsdp2", property(lambda self: True))
    monkeypatch.setattr(trainer.accelerator.state, "fsdp_plugin", fsdp, raising=False)
    trainer.is_fsdp_enabled = True
    assert _compile.compile_trainer_layers(trainer, trainer.model) == ""
    layers = trainer.model.config.num_hidden_layers
    assert _compile_layers.checkpointed_layers(trainer.model) == layers * in_graph
    seen = []
    spy = lambda *args: seen.append((fsdp.activation_checkpointing, trainer.accelerator.state.dynamo_plugin.backend))  # noqa: E731
    _compile._uncompiled_call(trainer.accelerator, spy, trainer.model, "optimizer")
    _compile._uncompiled_call(trainer.accelerator, spy, tiny_model("llama"))  # an eager model: wrapped as before
    assert seen == [(not in_graph, DynamoBackend.NO), (True, DynamoBackend.NO)] and fsdp.activation_checkpointing


@pytest.mark.slow
def test_a_model_failing_its_compiled_warm_up_is_refused_with_the_fix(tmp_path, monkeypatch):
    # under FSDP the model sits off the GPU at construction, where no compiled step is tried: a compile failure
    # shows in the warm-up before the first step, which names the way to train eager
    def fails(graph, example_inputs):  # a Dynamo backend that cannot compile this model's layers
        raise RuntimeError("this backend compiles nothing")

    monkeypatch.setattr(models, "auto_compile_blocker", lambda model, device: "")
    monkeypatch.setattr(models, "compiled_step_failure", lambda model, autocast=None: "")  # untried
    trainer = _trainer(tmp_path)
    assert trainer._compile.enabled and _compile_layers.uncompile_layers(trainer.model)
    _compile_layers.compile_layers(trainer.model, backend=fails)
    with pytest.raises(RuntimeError, match=r"failed its warm-up before the first step .*this backend compiles "
                                           r"nothing.*compile_layers=False"):  # fmt: skip
        trainer.train()
    assert trainer.state.global_step == 0


def test_an_accelerator_made_anew_prepares_the_compiled_layers_as_the_first(tmp_path, monkeypatch):
    # a hyperparameter trial makes a new accelerator after model_init compiled the layers: it must not compile the
    # whole model over them (nor wrap FSDP2's checkpoint around them), as the first one was kept from doing
    from accelerate import Accelerator
    from accelerate.utils import DynamoBackend

    monkeypatch.setattr(models, "auto_compile_blocker", lambda model, device: "")
    trainer = _trainer(tmp_path, steps=1)
    first, seen = trainer.accelerator, []
    monkeypatch.setattr(Accelerator, "prepare_model",
                        lambda self, model, *a, **k: seen.append(self.state.dynamo_plugin.backend) or model)
    trainer.create_accelerator_and_postprocess()
    assert trainer.accelerator is not first and trainer._compile.whole_model == ""
    trainer.accelerator.state.dynamo_plugin.backend = DynamoBackend.INDUCTOR  # torch_compile=True's
    try:
        trainer.accelerator.prepare_model(trainer.model)
    finally:
        trainer.accelerator.state.dynamo_plugin.backend = DynamoBackend.NO
    assert hasattr(trainer.accelerator, "_packing_prepare") and seen == [DynamoBackend.NO]
