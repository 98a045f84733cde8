"""Compiled layers under FSDP2 on 2 gloo ranks, wrapped as accelerate's FSDP2 wraps a PackingTrainer's model.

PackingTrainer compiles the decoder layers at construction; accelerate then shards each layer with ``fully_shard``,
whose hooks unshard the parameters around the layer's call, outside the compiled forward (torchtitan's order too).
With ``fsdp_config`` ``activation_checkpointing``, PackingTrainer compiles each layer's checkpoint inside its graph
(``compile_layers(checkpoint=True)``) instead of accelerate's ``checkpoint_wrapper`` around it; the wrapper is
tested too (where accelerate keeps it: its CPU offload, a policy wrapping other modules), and transformers' own
checkpointing (``activation_checkpointing_enable``, ``gradient_checkpointing_enable`` before 5.25; both names are
tested compiled in tests/trainer/test_compile.py), which from 5.24 checkpoints in the class's forward only when that is the
outermost one: FSDP2 swaps the class. All cases run in one launch of the two ranks. Gradients equal eager's, and what the first step saves for its
backward shows each checkpoint kept (a lost one trains right, on more memory).
Each rank trains two steps of other lengths and example counts; the reference is one eager process
that averages the two ranks' gradients, as FSDP does. Compiled with Dynamo's ``aot_eager`` backend: the
graphs and their autograd as on a GPU, no C compiler needed (Inductor's kernels run on the GPU runs).
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import random_examples, tiny_model
from _two_ranks import run_two_ranks

from packing_collators import FlatteningCollator

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

STEPS = ([9, 14, 5, 11], [20, 3, 8])  # each rank's examples per step (seeded by rank and step)

WORKER = r"""
import sys
sys.path.insert(0, {tests!r})
import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import fully_shard
from _tiny_models import random_examples, tiny_model
from _dynamo import reset_dynamo
from _moes import tiny_moe
from packing_collators import FlatteningCollator
from packing_collators._compat import enable_activation_checkpointing
from packing_collators.models import compile_layers, compiled_layer_count
from packing_collators.models._compile_layers import graphs_compiled, uncompile_layers

BUILD = {build!r}
dist.init_process_group("gloo")
rank = dist.get_rank()


def case(arch, wrapping):
    reset_dynamo()  # each case compiles its own graphs, as a process of its own would
    torch.manual_seed(0)
    model = eval(BUILD[arch])
    compiled = compile_layers(model, backend="aot_eager", checkpoint=wrapping == "checkpoint_in_graph")
    layers = model.model.layers
    for index in range(len(layers)):
        if wrapping == "checkpointed":
            layers[index] = checkpoint_wrapper(layers[index], preserve_rng_state=False)
        fully_shard(layers[index])
    fully_shard(model)
    # transformers' own, enabled after the compile as the Trainer enables it: by its deprecated name, and by the
    # name 5.25 gave it (activation_checkpointing_enable; the same method before 5.25)
    if wrapping == "hf_activation_checkpointing":
        enable_activation_checkpointing(model, {{"use_reentrant": False}})
    before, saved = graphs_compiled(), []
    for step, lengths in enumerate({steps!r}):
        batch = FlatteningCollator()(random_examples(lengths, seed=10 * rank + step))
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            loss = model(**batch).loss
        (loss / len({steps!r})).backward()
    grads = {{n.replace("_checkpoint_wrapped_module.", ""): p.grad.full_tensor() for n, p in model.named_parameters()
             if p.grad is not None}}
    return {{"grads": grads, "compiled": compiled, "still_compiled": compiled_layer_count(model),
            "layer": type(model.model.layers[0]).__name__, "graphs": graphs_compiled() - before,
            "uncompiled": uncompile_layers(model), "layers": len(model.model.layers), "saved": sum(saved)}}


results = {{f"{{arch}}-{{wrapping}}": case(arch, wrapping) for arch, wrapping in {cases!r}}}
if rank == 0:
    torch.save(results, sys.argv[1] + "/rank0.pt")
"""


# as checkpoints configure them: the cache on, tied embeddings (Llama 3.2's), 8 experts routed 2 per token
BUILD = {"llama": 'tiny_model("llama", use_cache=True, tie_word_embeddings=True)', "qwen3_moe": 'tiny_moe("qwen3_moe").train()'}


def _reference(arch):
    from _moes import tiny_moe  # noqa: F401 (BUILD's expressions)

    model = eval(BUILD[arch])
    for rank in range(2):
        for step, lengths in enumerate(STEPS):
            loss = model(**FlatteningCollator()(random_examples(lengths, seed=10 * rank + step))).loss
            (loss / len(STEPS) / 2).backward()  # FSDP averages the ranks' gradients
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _saved_eager(arch):
    """Bytes one eager process saves for the backward over rank 0's steps, no checkpoint: what a checkpoint cuts."""
    from _moes import tiny_moe  # noqa: F401 (BUILD's expressions)

    model, saved = eval(BUILD[arch]), []
    for step, lengths in enumerate(STEPS):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):  # fmt: skip
            model(**FlatteningCollator()(random_examples(lengths, seed=step)))
    return sum(saved)


# transformers' checkpointing by its deprecated name (gradient_checkpointing_enable) is the same method as by its new
# one; both names are tested compiled in tests/trainer/test_compile.py, so one launch case here is enough
CASES = [("llama", "checkpointed"), ("llama", "checkpoint_in_graph"), ("llama", "hf_activation_checkpointing"),
         ("llama", "sharded"), ("qwen3_moe", "checkpoint_in_graph")]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every case in one launch of two ranks (a launch costs seconds of start-up and import), each case on its own
    model and Dynamo state."""
    out = tmp_path_factory.mktemp("fsdp2")
    build = repr(BUILD).replace("{", "{{").replace("}", "}}")  # the worker's source goes through str.format
    worker = WORKER.replace("{build!r}", build).replace("{steps!r}", repr(STEPS)).replace("{cases!r}", repr(CASES))
    run_two_ranks(worker, out, timeout=480)
    return torch.load(out / "rank0.pt")


@pytest.mark.parametrize("arch, wrapping", CASES)
def test_compiled_layers_under_fsdp2_give_the_eager_gradients(two_ranks, arch, wrapping):
    result = two_ranks[f"{arch}-{wrapping}"]
    reference = _reference(arch)
    # the compiled forwards survive the wrapping, counted once (not again through the wrapper), and can be undone
    assert result["compiled"] == result["still_compiled"] == result["uncompiled"] == result["layers"] >= 2
    layer = {"llama": "LlamaDecoderLayer", "qwen3_moe": "Qwen3MoeDecoderLayer"}[arch]
    expected = "FSDPCheckpointWrapper" if wrapping == "checkpointed" else f"FSDP{layer}"  # in graph: no wrapper
    assert result["layer"] == expected
    assert result["graphs"] >= 1  # the layers ran compiled, not eager
    # checkpointed, each layer keeps little for its backward (tiny models: about half what none keeps; the wrapper's
    # a fifth); compiled without a checkpoint, about 0.8 of eager's (the graph's own choice of what to keep)
    checkpointed = wrapping != "sharded"
    eager = _saved_eager(arch)
    assert (result["saved"] < 0.65 * eager) == checkpointed, (result["saved"], eager)
    assert result["grads"].keys() == reference.keys()
    for name, grad in reference.items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
