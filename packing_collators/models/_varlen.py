"""Which stateful layers run a packed row on varlen kernels, and the call that runs one.

    family               found by (its structure)                           kernels             module
    Gated DeltaNet       in_proj_qkv.. / in_proj_qkvz.., conv1d, A_log        conv, delta_rule    _gated_deltanet.py
    Mamba2               in_proj, conv1d, A_log (one per head), D, dt_bias    conv, ssd           _mamba2.py
    short convolution    in_proj (3 x channels), depthwise conv, out_proj     conv                _short_conv.py
    KDA                  q/k/v_proj, conv1d, forget_gate, b_proj, o_norm       conv, kda           _kda.py
    lightning attention  qkv_proj, output_gate, slope_rate                    ssd                 _lightning.py

Any other stateful layer (Mamba (1), RG-LRU, OLMo-hybrid's and LaRA's Gated DeltaNet, Inkling2's
convolution, ...) has no varlen path and runs per example. A packed batch of ``B`` rows is run as one
row of ``B * T`` tokens (the boundaries are over the flattened tokens) and laid back:

    hidden (B, T, H) -> (1, B * T, H) -> the family's forward(layer, row, cu_seqlens, kernels, layout, mask)
                     -> (B, T, H)     (a tuple's first item; MiniMax's second, its state, is None)

Cost: one structure check per layer at ``enable_packing``; per call, two reshapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._gated_deltanet import gated_deltanet_layout, gated_deltanet_shared_forward, gated_deltanet_varlen_forward
from ._kda import kda_layout, kda_shared_forward, kda_varlen_forward
from ._kernels import VarlenKernels, zero_padding
from ._lightning import lightning_layout, lightning_shared_forward, lightning_varlen_forward
from ._mamba2 import mamba2_layout, mamba2_shared_forward, mamba2_varlen_forward
from ._short_conv import short_conv_layout, short_conv_shared_forward, short_conv_varlen_forward

__all__ = ["FAMILIES", "VarlenFamily", "VarlenLayer", "run_varlen", "varlen_layer"]


def _gated_deltanet(module, hidden_states, cu_seqlens, kernels, layout, mask=None):
    return gated_deltanet_varlen_forward(module, zero_padding(hidden_states, mask), cu_seqlens, kernels, layout)


@dataclass(frozen=True)
class VarlenFamily:
    """A kind of layer with a varlen path: its name, its detector, its forward and the kernels it calls."""

    name: str
    layout: Callable  # module -> layout name | None
    forward: Callable  # (module, row (1, T, H), cu_seqlens, kernels, layout, mask) -> output
    needs: tuple[str, ...]
    calls: str  # the fla functions, for the log and packing_layers()
    # (module, row (1, T, H) laid out with its prompts shared, the call's scope, kernels, layout) -> output, each
    # prompt once; None: the keys' layout, the prompt once per completion
    shared: Callable | None = None
    shared_needs_states: bool = False  # its shared path starts completions from states: kernels.prefix_states


FAMILIES = (
    VarlenFamily("Gated DeltaNet", gated_deltanet_layout, _gated_deltanet, ("conv", "delta_rule"),
                 "causal_conv1d + chunk_gated_delta_rule", gated_deltanet_shared_forward, shared_needs_states=True),
    VarlenFamily("Mamba2", mamba2_layout, mamba2_varlen_forward, ("conv", "ssd"), "causal_conv1d + the SSD scan",
                 mamba2_shared_forward),
    VarlenFamily("short convolution", short_conv_layout, short_conv_varlen_forward, ("conv",), "causal_conv1d",
                 short_conv_shared_forward),
    VarlenFamily("KDA", kda_layout, kda_varlen_forward, ("conv", "kda"), "causal_conv1d + chunk_kda",
                 kda_shared_forward, shared_needs_states=True),
    VarlenFamily("lightning attention", lightning_layout, lightning_varlen_forward, ("ssd",), "the SSD scan",
                 lightning_shared_forward),
)  # fmt: skip


@dataclass(frozen=True)
class VarlenLayer:
    """A layer's family and layout (``"split"``, ``"falcon_h1"``, ...)."""

    family: VarlenFamily
    layout: str

    def describe(self) -> str:
        return f"{self.family.name}, {self.layout} layout: {self.family.calls}"


def varlen_layer(module) -> VarlenLayer | None:
    """The varlen path of a stateful layer, or None (it runs per example)."""
    for family in FAMILIES:
        layout = family.layout(module)
        if layout is not None:
            return VarlenLayer(family, layout)
    return None


def run_varlen(
    varlen: VarlenLayer, layer, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, kernels: VarlenKernels,
    attention_mask=None,
):  # fmt: skip
    """The layer's output for a packed batch (B, T, H) whose examples end at ``cu_seqlens`` (over the B * T tokens);
    a (B, T) padding mask zeroes what the layer's own code zeroes, any other mask is the causal one (dropped)."""
    shape = hidden_states.shape[:2]
    row = hidden_states.reshape(1, -1, hidden_states.shape[-1])
    mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 else None
    mask = None if mask is None or tuple(mask.shape) != tuple(shape) else mask.reshape(1, -1)
    out = varlen.family.forward(layer, row, cu_seqlens, kernels, varlen.layout, mask)
    if isinstance(out, tuple):
        return (out[0].reshape(*shape, *out[0].shape[2:]), *out[1:])
    return out.reshape(*shape, *out.shape[2:])
