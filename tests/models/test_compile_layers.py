"""The decoder layers compiled in place (``compile_layers``; PackingTrainer under ``torch_compile=True``).

"aot_eager" builds the graphs Dynamo and AOTAutograd would hand Inductor, without its code generation:
what is tested is the tracing (one graph for every layer and every batch shape, no break), the arithmetic
(losses and gradients equal to eager), the copies (a deep copy runs its own weights) and which models are
kept compiled whole (and so on the full logits), with the reason.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from _tiny_models import random_examples, tiny_model, training_args

from packing_collators import FlatteningCollator, compile_layers
from packing_collators._compat import enable_activation_checkpointing
from packing_collators.models._compile_layers import compiled_layer_count, layer_compile_blocker, repeated_layers

BACKEND = "aot_eager"
BATCHES = [[7, 3, 12, 5, 9], [4, 9, 6], [30, 2], [5] * 7]  # other lengths, counts and longest examples


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # fa4_reference: conftest.py


def _losses_and_grads(model, checkpointing: str | None):
    """``checkpointing``: transformers' checkpointing turned on by its deprecated name (``gradient_checkpointing_enable``)
    or by the name 5.25 gave it (``activation_checkpointing_enable``; the same method before 5.25)."""
    if checkpointing == "gradient":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif checkpointing == "activation":
        enable_activation_checkpointing(model, {"use_reentrant": False})
    collate, losses = FlatteningCollator(), []
    for i, lengths in enumerate(BATCHES):
        loss = model(**collate(random_examples(lengths, seed=i))).loss
        loss.backward()
        losses.append(loss.detach())
    return torch.stack(losses), [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [None, "gradient", "activation"])
def test_one_graph_serves_every_layer_and_shape_and_trains_as_eager(fa4_reference, checkpointing):
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = tiny_model("llama", attn="packing_fa4", num_hidden_layers=3).bfloat16()  # FA4 runs bf16
    keys = list(compiled.state_dict())
    assert compile_layers(compiled, backend=BACKEND) == 3 and compiled_layer_count(compiled) == 3
    assert list(compiled.state_dict()) == keys  # nothing renamed: checkpoints load as before
    mine = _losses_and_grads(compiled, checkpointing)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters["graph_break"])
    assert all(layer.gradient_checkpointing for layer in compiled.model.layers) == bool(checkpointing)
    eager = tiny_model("llama", attn="packing_fa4", num_hidden_layers=3).bfloat16()
    theirs = _losses_and_grads(eager, checkpointing)
    torch.testing.assert_close(mine[0], theirs[0], rtol=0, atol=0)  # the same ops on the same inputs
    for a, b in zip(mine[1], theirs[1]):  # the reference backward differs from autograd's in rounding
        torch.testing.assert_close(a.float(), b.float(), rtol=0.05, atol=0.05)


@pytest.mark.slow
def test_layers_on_the_librarys_fused_kernels_compile_by_layer_and_keep_the_chunked_loss(tmp_path):
    # fused/'s forwards run torch's ops under torch.compile: the layers holding them compile one by one, one graph
    # for all, and train as the model's own layers; a forward replaced elsewhere (Liger's, a user's) still blocks
    import types

    from torch._dynamo.utils import counters

    from packing_collators import fuse_rms_norms, fuse_rope, fuse_swiglu
    from packing_collators.fused import unfuse_rope
    from packing_collators.trainer._head_loss import why_full_logits

    counters.clear()
    compiled = tiny_model("llama", num_hidden_layers=3)
    try:
        assert fuse_rms_norms(compiled) == 7 and fuse_swiglu(compiled) == 3 and fuse_rope(compiled)
        assert layer_compile_blocker(compiled) == ""
        assert compile_layers(compiled, backend=BACKEND) == 3
        mine = _losses_and_grads(compiled, None)
        assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters["graph_break"])
        trainer = _trainer(tmp_path, tiny_model("llama"))
        fuse_swiglu(trainer.model)
        trainer._compile.compile_layers(trainer.model)
        assert trainer._compile.whole_model == "" and why_full_logits(trainer) == ""
    finally:
        unfuse_rope()
    theirs = _losses_and_grads(tiny_model("llama", num_hidden_layers=3), None)
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(mine[1], theirs[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    foreign = tiny_model("llama")
    mlp = foreign.model.layers[1].mlp
    mlp.forward = types.MethodType(lambda self, x: type(self).forward(self, x), mlp)
    assert layer_compile_blocker(foreign) == "the forward of LlamaMLP inside a layer was replaced"


def test_a_deep_copy_runs_its_own_layers():
    model = tiny_model("llama")
    compile_layers(model, backend="eager")
    twin = copy.deepcopy(model)
    layer, twin_layer = model.model.layers[0], twin.model.layers[0]
    assert twin_layer.forward.__self__ is twin_layer and layer.forward.__self__ is layer
    batch = FlatteningCollator()(random_examples([6, 4]))
    before = model(**batch).loss
    with torch.no_grad():
        for p in twin.model.layers.parameters():
            p.zero_()
    torch.testing.assert_close(model(**batch).loss, before)  # the original's weights still run in the original
    assert not torch.allclose(twin(**batch).loss, before)  # and the copy runs its own (zeroed) layers


def test_compiling_twice_leaves_compiled_layers_alone():
    model = tiny_model("llama")
    first = compile_layers(model, backend="eager")
    forwards = [layer.forward for layer in model.model.layers]
    assert compile_layers(model, backend="eager") == 0 and first == len(forwards)
    assert [layer.forward for layer in model.model.layers] == forwards


def test_the_repeated_layers_are_the_decoder_layers():
    model = tiny_model("llama", num_hidden_layers=3)
    assert repeated_layers(model) == list(model.model.layers)
    assert repeated_layers(torch.nn.Linear(2, 2)) == []


def _trainer(tmp_path, model, backend=BACKEND, **options):
    from packing_collators import PackingTrainer

    rng = np.random.default_rng(0)
    return PackingTrainer(
        model=model,
        args=training_args(tmp_path, max_steps=2, gradient_accumulation_steps=1, torch_compile=True,
                           torch_compile_backend=backend),
        train_dataset=random_examples(rng.integers(3, 30, 24).tolist()),
        max_tokens_per_batch=90,
        packing_probe=False,
        **options,
    )  # fmt: skip


@pytest.mark.slow
def test_packing_trainer_compiles_the_layers_and_keeps_the_chunked_loss(tmp_path):
    from accelerate.utils import DynamoBackend

    trainer = _trainer(tmp_path, tiny_model("llama"))
    assert trainer._compile.whole_model == "" and compiled_layer_count(trainer.model) == 2
    plugin = trainer.accelerator.state.dynamo_plugin  # shared by every Accelerator: left as the arguments set it
    assert plugin.backend != DynamoBackend.NO
    trainer.train()
    assert type(trainer.model_wrapped).__name__ == "LlamaForCausalLM"  # no second, whole-model compile
    assert trainer._head_loss.heads[id(trainer.model)] is not None and trainer.compile_report.recompiles == 0
    assert plugin.backend != DynamoBackend.NO


@pytest.mark.slow
def test_a_stock_trainer_after_it_still_compiles_and_model_init_models_are_compiled(tmp_path):
    from transformers import Trainer

    first = _trainer(tmp_path, tiny_model("llama"), backend="eager")  # which compiler runs is not the point here
    stock = Trainer(model=tiny_model("llama"), args=first.args, train_dataset=first.train_dataset,
                    data_collator=FlatteningCollator())  # fmt: skip
    stock.train()  # the same TrainingArguments: accelerate's torch_compile=True still compiles the stock model
    assert type(stock.model_wrapped).__name__ == "OptimizedModule"
    from packing_collators import PackingTrainer

    rebuilt = PackingTrainer(model_init=lambda: tiny_model("llama"), args=first.args, train_dataset=first.train_dataset,
                             max_tokens_per_batch=90, packing_probe=False)  # fmt: skip
    rebuilt.train()  # train() builds the model anew: its layers are compiled too
    assert compiled_layer_count(rebuilt.model) == 2 and rebuilt._compile.whole_model == ""


def test_cuda_graph_modes_are_refused_for_shared_layer_graphs(tmp_path):
    with pytest.raises(ValueError, match="replays CUDA graphs.*Use mode=None"):
        compile_layers(tiny_model("llama"), mode="reduce-overhead")
    assert "replays CUDA graphs" in layer_compile_blocker(tiny_model("llama"), mode="max-autotune")


def test_a_model_whose_repeated_blocks_are_not_its_named_layers_is_compiled_whole():
    model = tiny_model("llama")
    model._no_split_modules = ["SomethingElse"]
    assert layer_compile_blocker(model).startswith("its repeated LlamaDecoderLayer blocks are not the layers it names")


def test_a_hybrid_model_stays_compiled_whole_with_the_reason(tmp_path):
    from _hybrids import HYBRIDS, tiny_hybrid

    kind = next(t for t in ("lfm2", "qwen3_next", "nemotron_h") if t in HYBRIDS)
    trainer = _trainer(tmp_path, tiny_hybrid(kind).train())
    assert "enable_packing prepared layers" in trainer._compile.whole_model
    assert compiled_layer_count(trainer.model) == 0
    from packing_collators.trainer._head_loss import why_full_logits

    assert why_full_logits(trainer).startswith("torch_compile=True compiles the whole model (enable_packing")
    assert layer_compile_blocker(trainer.model) == trainer._compile.whole_model


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "olmoe"])
def test_a_mixture_of_experts_compiles_its_decoder_layers_and_trains_as_eager(model_type):
    # 8 experts, 2 per token, use_cache as the checkpoint has it: the decoder layers are compiled (not an expert list,
    # in older layouts a ModuleList of identical MLPs longer than the layers), and the losses are eager's
    from _moes import MOES, tiny_moe

    if model_type not in MOES:
        pytest.skip(f"{model_type} is not in this transformers")
    compiled, eager = tiny_moe(model_type).train(), tiny_moe(model_type).train()
    assert repeated_layers(compiled) == list(compiled.model.layers)
    compile_layers(compiled, backend=BACKEND)
    collate = FlatteningCollator()
    for i, lengths in enumerate(BATCHES):
        batch = collate(random_examples(lengths, seed=i))
        mine, theirs = compiled(**batch).loss, eager(**batch).loss
        mine.backward(), theirs.backward()
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    for a, b in zip(compiled.parameters(), eager.parameters()):
        if a.grad is not None or b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)
