"""A Dynamo backend for the compile tests: it records each graph it is handed (whether its rows' length is
symbolic) and each call of one, and runs the graph as Dynamo's "aot_eager" backend does (AOTAutograd's forward
and backward graphs, without Inductor's code generation)."""

from __future__ import annotations

import torch


def symbolic_rows(graph_module) -> bool:
    """Whether an input of ``graph_module`` with two or more dimensions has a symbolic size: a dynamic row length
    (the packing sizes, ``cu_seq_lens`` and ``max_length``, are one-dimensional or scalars)."""
    for node in graph_module.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            if any(isinstance(size, torch.SymInt) for size in value.shape):
                return True
    return False


class GraphRecorder:
    """``graphs[i]``: graph i's rows are symbolic (:func:`symbolic_rows`); ``calls``: the graph index of each call."""

    def __init__(self) -> None:
        self.graphs: list[bool] = []
        self.calls: list[int] = []

    def __call__(self, graph_module, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        index = len(self.graphs)
        self.graphs.append(symbolic_rows(graph_module))
        compiled = lookup_backend("aot_eager")(graph_module, example_inputs)

        def run(*args):
            self.calls.append(index)
            return compiled(*args)

        return run
