"""The varlen kernels that stateful layers run a packed row on: flash-linear-attention's, or any with their signatures.

    kernel       fla's function           called as                                             by
    conv         causal_conv1d            (x (1, T, D), weight (D, W), bias, activation,        every layer with
                                          cu_seqlens) -> y (1, T, D)                            a short conv
    delta_rule   chunk_gated_delta_rule   (q, k, v, g, beta, cu_seqlens) -> o (1, T, HV, V)     Gated DeltaNet
                                          (initial_state=, output_final_state=: prefix_states)
    ssd          mamba-ssm's              (x, dt, A, B, C, D, chunk_size, cu_seqlens)           Mamba2, lightning
                 mamba_chunk_scan_combined, -> y (1, T, h, p) (``_ssd.py``)                     attention
                 or fla's chunk_simple_gla
    kda          chunk_kda                fla's own: (q, k, v, g=, beta=, cu_seqlens=,          KDA
                                          use_qk_l2norm_in_kernel=) -> (o (1, T, H, V), None)

Every kernel restarts its state (the conv window, the recurrence) at each boundary of ``cu_seqlens``
(int32 (S + 1,)), so the row's examples run in one launch per kernel, no padding. ``fla_kernels()``
finds them in the installed flash-linear-attention (``pip install "packing-collators[hybrid]"``), the SSD
scan in mamba-ssm where it is installed (the ``mamba2`` extra), else in fla; a kernel that is missing or takes
no ``cu_seqlens`` is None, and the layers that need it run per example (so are the gated ones where fla's
backward would refuse to run: on Hopper with Triton < 3.7.1, the delta rule without tilelang, and fla's simple
GLA always, so the SSD scan there only from mamba-ssm). The tests pass torch references with the same signatures (``tests/models/_gdn_reference.py``,
``_varlen_reference.py``), so the wiring is checked on a CPU. Cost: one import, at ``enable_packing``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from ._ssd import MAMBA2_EXTRA, mamba_ssm_ssd, simple_gla_ssd

__all__ = ["FLA_CHECKED", "HYBRID_EXTRA", "VarlenKernels", "causal_conv", "fla_kernels", "zero_padding"]

FLA_CHECKED = "0.6.0"  # the flash-linear-attention version the varlen paths were written against and measured with
HYBRID_EXTRA = 'pip install "packing-collators[hybrid]"'


@dataclass(frozen=True)
class VarlenKernels:
    """The kernels of one package (signatures in the module docstring), used for hidden states on
    ``device_type``; a kernel that is None sends the layers that need it per example."""

    conv: Callable
    delta_rule: Callable | None
    name: str
    device_type: str = "cuda"
    ssd: Callable | None = None
    kda: Callable | None = None
    why_missing: str = ""  # why a kernel is None, where not "this package has none with cu_seqlens"
    # delta_rule (and kda, as fla's chunk_kda does) also takes initial_state= (N, HV, K, V) and, with
    # output_final_state=True, returns (o, final states): a shared prompt's Gated DeltaNet and KDA layers then run
    # each prompt once (``_shared_prefix.py``)
    prefix_states: bool = False

    def missing(self, needs: tuple[str, ...]) -> tuple[str, ...]:
        """The kernels of ``needs`` this package lacks."""
        return tuple(name for name in needs if getattr(self, name) is None)


def causal_conv(kernels: VarlenKernels, conv1d, x, activation: str | None, cu_seqlens):
    """A layer's depthwise causal ``Conv1d`` over each example of ``x`` (1, T, D), then ``activation`` (fused into
    fla's kernel for silu; any other after it), in the conv's dtype and back, as transformers' ``causal_conv1d_fn``."""
    fused = activation if activation in ("silu", "swish") else None
    weight = conv1d.weight.squeeze(1)
    y = kernels.conv(x.to(weight.dtype), weight, conv1d.bias, fused, cu_seqlens)
    if activation is not None and fused is None:
        from transformers.activations import ACT2FN

        y = ACT2FN[activation](y)
    return y.to(x.dtype)


def zero_padding(x, mask):
    """transformers' ``apply_mask_to_padding_states``: the tokens a (1, T) padding mask zeroes, zeroed (None: none)."""
    return x if mask is None else (x * mask[:, :, None]).to(x.dtype)


def _fla_conv(x, weight, bias, activation, cu_seqlens):
    try:
        from fla.modules.causal_conv1d import causal_conv1d
    except ImportError:  # flash-linear-attention before 0.5 kept it in fla.modules.convolution
        from fla.modules.convolution import causal_conv1d
    out = causal_conv1d(x=x, weight=weight, bias=bias, activation=activation, cu_seqlens=cu_seqlens)
    return out[0] if isinstance(out, tuple) else out


def _fla_delta_rule(q, k, v, g, beta, cu_seqlens, initial_state=None, output_final_state=False):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    o, final = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True,
                                      initial_state=initial_state, output_final_state=output_final_state)  # fmt: skip
    return (o, final) if output_final_state else o


def _version() -> str:
    for distribution in ("fla-core", "flash-linear-attention"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "?"


def _with_cu_seqlens(module: str, name: str):
    """``module.name`` if it imports and takes ``cu_seqlens``, else None."""
    try:
        function = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - ImportError, or Triton failing to import this kernel here
        return None
    return function if "cu_seqlens" in inspect.signature(function).parameters else None


def _gated_backward_refused(*, simple_gla: bool = False) -> str:
    """Why fla's gated chunk backward would raise here, or "": on Hopper with Triton 3.4 to 3.7.0 it refuses to run
    its Triton kernel ("incorrect results", fla #640). tilelang's kernel stands in for the delta rule's; for simple
    GLA's (Mamba2, lightning attention) it does not: simple GLA keeps its state in float32 and lightning passes
    ``g_gamma``, which tilelang's backend refuses (seen on an H100 with Triton 3.6.0 and tilelang 0.1.15)."""
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except ImportError:
        return ""
    if not (IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1):
        return ""
    if simple_gla:
        return (
            "fla's simple-GLA backward refuses Hopper with Triton < 3.7.1 and tilelang does not cover it: the SSD scan "
            f"needs mamba-ssm there ({MAMBA2_EXTRA}) or Triton >= 3.7.1"
        )
    if importlib.util.find_spec("tilelang") is not None:
        return ""
    return "fla's gated backward needs tilelang on Hopper with Triton < 3.7.1 (pip install tilelang, or Triton >= 3.7.1)"


def fla_kernels() -> tuple[VarlenKernels | None, str]:
    """flash-linear-attention's varlen kernels, or None and why not (not installed, or without ``cu_seqlens``)."""
    try:
        try:
            from fla.modules.causal_conv1d import causal_conv1d
        except ImportError:
            from fla.modules.convolution import causal_conv1d
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as error:  # noqa: BLE001 - ImportError, or Triton failing to import on this machine
        return None, f"flash-linear-attention is not importable ({type(error).__name__}: {error})"
    version = _version()
    for function in (causal_conv1d, chunk_gated_delta_rule):
        if "cu_seqlens" not in inspect.signature(function).parameters:
            return None, (
                f"flash-linear-attention {version}'s {function.__name__} takes no cu_seqlens; install "
                f"flash-linear-attention>={FLA_CHECKED} for the varlen kernels"
            )
    refused, name = _gated_backward_refused(), f"flash-linear-attention {version}"
    ssd, ssd_from = mamba_ssm_ssd()
    simple_refused = "" if ssd is not None else _gated_backward_refused(simple_gla=True)
    if ssd is not None:
        name += f" and {ssd_from}'s SSD scan"
    elif not simple_refused:
        simple_gla = _with_cu_seqlens("fla.ops.simple_gla", "chunk_simple_gla")
        ssd = None if simple_gla is None else simple_gla_ssd(simple_gla)
    kernels = VarlenKernels(
        _fla_conv,
        None if refused else _fla_delta_rule,
        name,
        ssd=ssd,
        kda=_with_cu_seqlens("fla.ops.kda", "chunk_kda"),
        why_missing="; ".join(why for why in (refused, simple_refused) if why),
        prefix_states=True,
    )
    return kernels, ""
