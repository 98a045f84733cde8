"""Routed experts run one token at a time during the probe, so that its leak test stays exact on MoE models.

A mixture-of-experts layer routes each token to k of E experts (the router sees the whole row); the
experts module, ``forward(hidden_states, top_k_index, top_k_weights)`` in transformers, then runs
each expert's matmuls over the tokens routed to it::

    tokens     a1 a2 | b1 b2 | c1 c2         experts 2 per token, of 8
    expert 3   [ a2  b1  c1 ] @ W3           3 rows: change B, and it may get 2 or 4
    expert 5   [ a1  c1 ]     @ W5

A matmul rounds by its shape, so changing example B changes the rows of the experts A and C share
with it, and A's and C's outputs move by float32 rounding (1e-8 to 3e-6 on a CPU) though no token saw
another. During the probe each experts module runs twice per call: as the model runs it (batched)
and once per token (the same module and implementation on that token's row, routing and weights),
and the per-token output goes on. A token's expert output is then a function of that token alone,
so the leak test stays exact, and the largest batched vs per-token difference is measured
(``ExpertsRounding``) and must stay within the dtype's tolerance: an experts module that mixes
tokens beyond rounding is refused by name. Routing runs unchanged over the whole row, so a router
whose choice depends on other tokens (expert capacity) still moves the other examples' logits.
Cost: one extra call per token and MoE layer, during the probe only (about 30 tokens).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ._probe_parts import tolerance

__all__ = ["ExpertsRounding", "routed_experts", "tokenwise_experts"]

# The experts interface of transformers 5 (``use_experts_implementation``, ``ExpertsInterface``): a module
# whose forward takes these computes each token from its own row, routing and weights.
_ROUTED = ("hidden_states", "top_k_index", "top_k_weights")


@dataclass
class ExpertsRounding:
    """The largest |batched - per token| output of the routed experts seen so far, and where.

    Attributes:
        modules: the routed experts modules' class names (empty for a model without them).
        difference: the largest |batched - per token| output difference.
        scale: the largest |batched output| (what the tolerance scales with).
        worst: the module (``name (Class)``) of the largest difference, or None.
    """

    modules: tuple[str, ...] = ()
    difference: float = 0.0
    scale: float = 0.0
    worst: str | None = None
    _pending: list = field(default_factory=list, repr=False)

    def add(self, name: str, batched, tokenwise) -> None:
        """Keep one call's difference (as tensors: no device sync inside the forward)."""
        self._pending.append((name, (batched - tokenwise).abs().max().detach(), batched.abs().max().detach()))

    def settle(self) -> ExpertsRounding:
        """Turn the kept differences into numbers (once the forwards have run); returns self."""
        for name, difference, scale in self._pending:
            difference, scale = float(difference), float(scale)
            if difference > self.difference or self.worst is None:
                self.difference, self.worst = difference, name
            self.scale = max(self.scale, scale)
        self._pending.clear()
        return self

    def report_fields(self, dtype: str) -> dict:
        """The ``ProbeReport`` fields of this measurement, its tolerance that of ``dtype`` (scaled by ``scale``).

        >>> ExpertsRounding(("MixtralExperts",), 2e-07, 4.0, "model.layers.0.mlp.experts").report_fields("float32")
        {'experts': ('MixtralExperts',), 'experts_rounding': 2e-07, 'experts_tolerance': 0.0004, 'experts_worst': 'model.layers.0.mlp.experts'}
        """
        return {
            "experts": self.modules,
            "experts_rounding": self.difference,
            "experts_tolerance": tolerance(dtype, np.array([self.scale])),
            "experts_worst": self.worst,
        }


def routed_experts(model) -> list[tuple[str, object]]:
    """The (name, module) of each routed experts module of ``model``: its forward takes
    ``hidden_states, top_k_index, top_k_weights`` (transformers' experts interface).

    >>> from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    >>> config = Qwen3MoeConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                         num_key_value_heads=1, moe_intermediate_size=8, num_experts=8, num_experts_per_tok=2)
    >>> [name for name, _ in routed_experts(Qwen3MoeForCausalLM(config))]
    ['model.layers.0.mlp.experts']
    """
    found = []
    for name, module in model.named_modules():
        forward = getattr(type(module), "forward", None)
        try:
            parameters = inspect.signature(forward).parameters if forward is not None else {}
        except (TypeError, ValueError):
            continue
        if all(p in parameters for p in _ROUTED):
            found.append((name, module))
    return found


def _tokenwise(forward: Callable, name: str, rounding: ExpertsRounding) -> Callable:
    """``forward`` run batched and once per token; the per-token output is returned, the difference kept."""
    import torch

    signature = inspect.signature(forward)

    def run(*args, **kwargs):
        batched = forward(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        hidden, index, weights = (bound.arguments[p] for p in _ROUTED)
        tokens = hidden.shape[0]
        if not (torch.is_tensor(batched) and batched.shape[0] == tokens == index.shape[0] == weights.shape[0]):
            return batched  # a layout this does not know: the model's own output (the leak test then sees its rounding)
        rows = []
        for t in range(tokens):
            bound.arguments.update(zip(_ROUTED, (hidden[t : t + 1], index[t : t + 1], weights[t : t + 1])))
            rows.append(forward(*bound.args, **bound.kwargs))
        tokenwise = torch.cat(rows)
        rounding.add(name, batched, tokenwise)
        return tokenwise

    # a compiled model's probe runs this eagerly (a graph break) instead of tracing a loop over the tokens
    return torch.compiler.disable(run)


@contextlib.contextmanager
def tokenwise_experts(model) -> Iterator[ExpertsRounding]:
    """Inside, every routed experts module of ``model`` computes each token on its own (see the module
    docstring); yields the ``ExpertsRounding`` measured, settled on exit. A model without routed experts
    runs unchanged.

    >>> import torch
    >>> from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    >>> config = Qwen3MoeConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                         num_key_value_heads=1, moe_intermediate_size=8, num_experts=8, num_experts_per_tok=2)
    >>> model = Qwen3MoeForCausalLM(config).eval()
    >>> with torch.no_grad(), tokenwise_experts(model) as rounding:
    ...     _ = model(input_ids=torch.arange(1, 13)[None])
    >>> rounding.modules, rounding.worst, rounding.difference < 1e-5
    (('Qwen3MoeExperts',), 'model.layers.0.mlp.experts (Qwen3MoeExperts)', True)
    """
    experts = routed_experts(model)
    rounding = ExpertsRounding(modules=tuple(dict.fromkeys(type(m).__name__ for _, m in experts)))
    missing = object()
    patched = []
    try:
        for name, module in experts:
            patched.append((module, module.__dict__.get("forward", missing)))
            module.forward = _tokenwise(module.forward, f"{name} ({type(module).__name__})", rounding)
        yield rounding
    finally:
        for module, own in reversed(patched):
            if own is missing:
                del module.forward
            else:
                module.forward = own
        rounding.settle()
