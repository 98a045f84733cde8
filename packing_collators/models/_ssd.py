"""The SSD scan of Mamba2 (and of lightning attention) over a packed row: mamba-ssm's Triton kernel or fla's simple GLA.

    ssd(x (1, T, h, p), dt (1, T, h) float32, A (h,) float32, B (1, T, g, n), C (1, T, g, n), D (h,) | None,
        chunk_size, cu_seqlens) -> y (1, T, h, p)

    state_t = exp(A dt_t) state_{t-1} + B_t^T (dt_t x_t)      (n x p per head; each group's B and C shared by
    y_t     = C_t state_t + D x_t                              h / g heads, as transformers' repeat_interleave)

with the state restarted at every boundary of ``cu_seqlens`` (int32 (S + 1,)). ``dt`` comes in final: the
softplus, the bias and the clamp are the caller's. Two providers, the first found is used:

    mamba-ssm  mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D, seq_idx=...)   Mamba2's own Triton
               kernel; seq_idx (1, T), the example of each token, from cu_seqlens. Trains on Hopper with Triton 3.6.
    fla        chunk_simple_gla(q=C, k=B (repeated to h heads), v=x * dt, g=A * dt, scale=1, cu_seqlens) + D x.
               Its backward refuses Hopper with Triton < 3.7.1 (fla #640), where ``_kernels`` does not offer it.

mamba-ssm is installed by the ``mamba2`` extra; built without its CUDA extensions (``MAMBA_SKIP_CUDA_BUILD=TRUE``,
no nvcc, seconds) the scan is all there (it is Triton), but ``import mamba_ssm`` fails: the package's
``__init__`` imports the compiled selective scan (Mamba 1). The scan's module is then imported without running
that ``__init__``, and ``sys.modules`` is put back as it was, so nobody else sees a half-imported mamba_ssm.
Cost: one import at ``enable_packing``; per call, seq_idx (T int32) for mamba-ssm, B and C repeated for fla.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable

import torch

__all__ = ["MAMBA2_EXTRA", "mamba_ssm_ssd", "simple_gla_ssd"]

MAMBA2_EXTRA = 'MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-build-isolation "packing-collators[hybrid,mamba2]"'
_SCAN_MODULE = "mamba_ssm.ops.triton.ssd_combined"


def simple_gla_ssd(simple_gla: Callable) -> Callable:
    """The SSD scan on fla's ``chunk_simple_gla`` signature (q, k, v, g=, scale=, cu_seqlens=) -> (o, state)."""

    def ssd(x, dt, A, B, C, D, chunk_size, cu_seqlens):
        repeat = x.shape[2] // B.shape[2]
        B, C = B.repeat_interleave(repeat, dim=2), C.repeat_interleave(repeat, dim=2)
        values = (x.float() * dt[..., None]).to(x.dtype)
        y, _ = simple_gla(C, B, values, g=A * dt, scale=1.0, cu_seqlens=cu_seqlens)
        return y if D is None else y.float() + D[:, None] * x.float()

    ssd.provider = "chunk_simple_gla"
    return ssd


def _mamba_chunk_scan(scan: Callable) -> Callable:
    """The SSD scan on mamba-ssm's ``mamba_chunk_scan_combined`` signature, boundaries as ``seq_idx``."""

    def ssd(x, dt, A, B, C, D, chunk_size, cu_seqlens):
        lengths = cu_seqlens.diff()
        examples = torch.arange(len(lengths), device=x.device, dtype=torch.int32)
        seq_idx = examples.repeat_interleave(lengths, output_size=x.shape[1])[None]
        return scan(x, dt, A, B, C, chunk_size, D=D, seq_idx=seq_idx)

    ssd.provider = "mamba_chunk_scan_combined"
    return ssd


def _without_package_init(package: str, module: str):
    """``module`` imported with ``package``'s ``__init__`` skipped; ``sys.modules`` restored afterwards."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{package} is not an installed package")
    def imported() -> list[str]:
        return [name for name in sys.modules if name == package or name.startswith(package + ".")]

    saved = {name: sys.modules.pop(name) for name in imported()}
    sys.modules[package] = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
    try:
        return importlib.import_module(module)
    finally:
        for name in imported():
            del sys.modules[name]
        sys.modules.update(saved)


def mamba_ssm_ssd() -> tuple[Callable | None, str]:
    """mamba-ssm's SSD scan with ``cu_seqlens`` boundaries, and its name; or None and why not."""
    if importlib.util.find_spec("mamba_ssm") is None:
        return None, "mamba-ssm is not installed"
    try:
        scan = importlib.import_module(_SCAN_MODULE).mamba_chunk_scan_combined
    except ImportError:  # built without its CUDA extensions: the package's __init__ needs them, the scan does not
        try:
            scan = _without_package_init("mamba_ssm", _SCAN_MODULE).mamba_chunk_scan_combined
        except Exception as error:  # noqa: BLE001 - ImportError, or Triton failing to import here
            return None, f"mamba-ssm's SSD scan is not importable ({type(error).__name__}: {error})"
    except Exception as error:  # noqa: BLE001
        return None, f"mamba-ssm's SSD scan is not importable ({type(error).__name__}: {error})"
    if "seq_idx" not in inspect.signature(scan).parameters:
        return None, "mamba-ssm's mamba_chunk_scan_combined takes no seq_idx (pip install \"mamba-ssm>=2.2.4\")"
    try:
        version = importlib.metadata.version("mamba-ssm")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return _mamba_chunk_scan(scan), f"mamba-ssm {version}"
