"""The one way fused/ replaces a module's forward: where the module is recognised, its own forward kept beside."""

from __future__ import annotations

import types
from collections.abc import Callable

import torch

__all__ = ["swap_forwards", "swapped_here"]

# the forwards swap_forwards gives: each runs torch's own ops under torch.compile (the module's forward, or
# rms_norm), so a layer holding them compiles as the model's own layer does
_FORWARDS: set[Callable] = set()


def swap_forwards(model: torch.nn.Module, recognises: Callable[[torch.nn.Module], bool], forward: Callable) -> int:
    """Give every module of ``model`` that ``recognises`` accepts ``forward`` (a function of ``self``; the module's own
    forward kept as ``_packing_own_forward`` for the calls it does not take); returns how many modules have it.
    Idempotent: a module that has it already is counted, not wrapped again.

    >>> net = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    >>> def doubled(self, x):
    ...     return 2 * self._packing_own_forward(x)
    >>> swap_forwards(net, lambda m: isinstance(m, torch.nn.Tanh), doubled), swap_forwards(net, lambda m: False, doubled)
    (1, 1)
    >>> net(torch.tensor([0.5])) == 2 * torch.tanh(torch.tensor([0.5]))
    tensor([True])
    """
    _FORWARDS.add(forward)
    swapped = 0
    for module in model.modules():
        if getattr(module.forward, "__func__", None) is forward:
            swapped += 1
        elif recognises(module):
            module._packing_own_forward = module.forward
            module.forward = types.MethodType(forward, module)
            swapped += 1
    return swapped


def swapped_here(module: torch.nn.Module) -> bool:
    """Whether ``module``'s own forward is one :func:`swap_forwards` gave it (not Liger's, not a user's).

    >>> net = torch.nn.Sequential(torch.nn.Tanh())
    >>> _ = swap_forwards(net, lambda m: isinstance(m, torch.nn.Tanh), lambda self, x: self._packing_own_forward(x))
    >>> swapped_here(net[0]), swapped_here(net)
    (True, False)
    """
    return getattr(vars(module).get("forward"), "__func__", None) in _FORWARDS
