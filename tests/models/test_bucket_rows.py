"""``bucket_rows()``: inside, the layers ``compile_layers`` compiled trace the row length static (rows padded to a
bucket; faster steps: docs/benchmarks.md), the number of examples still symbolic; outside,
dynamic shapes; and a dynamic graph compiled after a static one never takes the static one's calls (Dynamo tries a
function's newest graph first)."""

from __future__ import annotations

import pytest
import torch
from _graph_recorder import GraphRecorder
from _tiny_models import random_examples, tiny_model

from packing_collators import FlatteningCollator, compile_layers
from packing_collators._compat import dynamo_sources_by_pattern
from packing_collators.models._compile_layers import bucket_rows

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # fa4_reference: conftest.py


def _model():
    return tiny_model("llama", attn="packing_fa4", num_hidden_layers=2).bfloat16()  # FA4 runs bf16


def _loss(model, batch, backward: bool = True):
    loss = model(**batch).loss
    if backward:
        loss.backward()
    return loss.detach()


@pytest.mark.slow  # Dynamo traces the tiny Llama: seconds
@pytest.mark.parametrize("checkpoint", [False, True])
def test_inside_the_row_length_is_static_and_its_graph_keeps_the_buckets_calls(fa4_reference, checkpoint):
    recorder, eager = GraphRecorder(), _model()
    model = _model()
    assert compile_layers(model, backend=recorder, checkpoint=checkpoint) == 2
    bucketed, plain = FlatteningCollator(pad_to_buckets=[64]), FlatteningCollator()
    with bucket_rows():  # two counts of examples, one bucket: one graph, its rows static
        for i, lengths in enumerate([[7, 3, 12, 5, 9], [4, 9, 6]]):
            batch = bucketed(random_examples(lengths, seed=i))
            assert torch.equal(_loss(model, batch), _loss(eager, batch))  # the same ops on the same inputs
    # before torch 2.8 the packing sizes become symbolic at the second count (automatic dynamic): a second graph
    static = len(recorder.graphs)
    assert static == (1 if dynamo_sources_by_pattern() else 2) and not any(recorder.graphs)
    for i, lengths in enumerate([[11, 8], [5, 6, 2]]):  # outside: other row lengths, dynamic graphs
        batch = plain(random_examples(lengths, seed=10 + i))
        assert torch.equal(_loss(model, batch), _loss(eager, batch))
    graphs, calls = list(recorder.graphs), len(recorder.calls)
    assert len(graphs) > static and all(graphs[static:])
    with bucket_rows():  # back in the bucket, a count not seen: the last static graph again, nothing compiled
        batch = bucketed(random_examples([5] * 7, seed=20))
        assert torch.equal(_loss(model, batch), _loss(eager, batch))
    assert recorder.graphs == graphs and set(recorder.calls[calls:]) == {static - 1}
    for compiled, reference in zip(model.parameters(), eager.parameters()):  # the backward too, every step
        torch.testing.assert_close(compiled.grad.float(), reference.grad.float(), rtol=0.05, atol=0.05)


@pytest.mark.slow
def test_each_bucket_gets_its_own_static_graph_where_dynamo_names_the_packing_sizes(fa4_reference):
    recorder, model = GraphRecorder(), _model()
    compile_layers(model, backend=recorder)
    bucketed = FlatteningCollator(pad_to_buckets=[32, 64])
    with bucket_rows(), torch.no_grad():
        for i, lengths in enumerate([[7, 3], [20, 30], [4, 9, 6], [25, 25, 3]]):  # 32, 64, 32, 64 tokens
            _loss(model, bucketed(random_examples(lengths, seed=i)), backward=False)
    if dynamo_sources_by_pattern():  # torch 2.8 on: two static graphs, each bucket's calls on its own
        assert recorder.graphs == [False, False] and recorder.calls == [0, 0, 1, 1, 0, 0, 1, 1]  # two layers a call
    else:  # before, the second bucket's length turns symbolic: why PackingTrainer keeps several buckets symbolic there
        assert recorder.graphs[0] is False and any(recorder.graphs[1:])


def test_the_trainer_traces_a_few_buckets_static_and_many_symbolic(monkeypatch):
    from packing_collators.trainer import _compile
    from packing_collators.trainer._compile import STATIC_BUCKETS, compile_plan

    def report(count: int):
        return compile_plan(FlatteningCollator(pad_to_buckets=[64 * i for i in range(1, count + 1)]), None, 64 * count
                            ).report  # fmt: skip

    one = compile_plan(FlatteningCollator(), None, 576).report  # PackingTrainer's own: the budget alone
    assert (one.buckets, one.static_rows) == ((576,), True) and "traced static" in one.summary()
    # a few buckets, a graph each, where Dynamo names the packing sizes from the first trace (torch 2.8 on)
    assert report(STATIC_BUCKETS).static_rows == dynamo_sources_by_pattern()
    many = report(STATIC_BUCKETS + 1)
    assert len(many.buckets) == STATIC_BUCKETS + 1 and not many.static_rows  # one graph for them all
    assert "traced symbolic" in many.summary()
    # torch 2.7 and earlier: automatic dynamic shapes would make a second bucket's length symbolic anyway
    monkeypatch.setattr(_compile, "dynamo_sources_by_pattern", lambda: False)
    assert report(1).static_rows and not report(2).static_rows
