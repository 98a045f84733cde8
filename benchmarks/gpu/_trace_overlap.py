"""Where a profiled step's GPU time goes: compute, communication hidden behind it, communication alone, idle.

From a torch.profiler Chrome trace (``prof.export_chrome_trace``), the GPU work of one device (kernels, copies,
memsets) is split into communication (NCCL's kernels, by name) and compute (all other GPU work, on any stream),
and the step's window into four disjoint parts::

    window   |-------------------------------------------------------------|
    compute  |=====   ======================   ========|        |=========|
    comm        |~~~~~~~~|          |~~~~|            |~~~~~~~~|
                 hidden  exposed    hidden             exposed   idle: neither

    compute_ms          time some compute kernel runs (the union over streams)
    comm_hidden_ms      communication while compute runs (costs only the SMs it takes from the matmuls)
    comm_exposed_ms     communication while no compute runs: the GPU waits on the network
    idle_ms             no kernel at all: the CPU is behind (launches, syncs, Python)

so that compute_ms + comm_exposed_ms + idle_ms = window_ms. A scaling loss shows up as exposed communication and
idle time the 1-GPU replay does not have, or as compute that runs longer beside hidden communication than alone.
Pure Python: a trace's events in, numbers out.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

__all__ = ["GPU_WORK", "is_communication", "kernel_events", "overlap", "overlap_of_trace", "union"]


def is_communication(name: str) -> bool:
    """NCCL's collective kernels (``ncclDevKernel_AllGather_RING_LL``, ``ncclKernel_ReduceScatter...``).

    >>> is_communication("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"), is_communication("sm90_xmma_gemm")
    (True, False)
    """
    return "nccl" in name.lower()


GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # the trace's categories of work on the GPU itself


def kernel_events(trace: dict, device: int | None = None) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel, copy and memset in a Chrome trace (on ``device``, else on every
    device).

    >>> kernel_events({"traceEvents": [{"cat": "kernel", "name": "k", "ts": 5.0, "dur": 2.0, "args": {"device": 0}},
    ...                                {"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 8.0, "dur": 1.0},
    ...                                {"cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 9.0}]})
    [('k', 5.0, 7.0), ('Memcpy HtoD', 8.0, 9.0)]
    """
    out = []
    for event in trace.get("traceEvents", []):
        if event.get("cat") not in GPU_WORK or "dur" not in event:
            continue
        if device is not None and event.get("args", {}).get("device", device) != device:
            continue
        out.append((event.get("name", ""), float(event["ts"]), float(event["ts"]) + float(event["dur"])))
    return out


def union(intervals) -> list[tuple[float, float]]:
    """Merged, sorted intervals.

    >>> union([(5, 7), (1, 3), (2, 4), (7, 8)])
    [(1, 4), (5, 8)]
    """
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _minus(intervals, cut) -> list[tuple[float, float]]:
    """Parts of the merged ``intervals`` outside the merged ``cut``."""
    out, j = [], 0
    for start, end in intervals:
        while j < len(cut) and cut[j][1] <= start:
            j += 1
        k, at = j, start
        while k < len(cut) and cut[k][0] < end:
            if cut[k][0] > at:
                out.append((at, cut[k][0]))
            at = max(at, cut[k][1])
            k += 1
        if at < end:
            out.append((at, end))
    return out


def overlap(kernels, window: tuple[float, float] | None = None) -> dict:
    """The split above, in milliseconds, of (name, start us, end us) kernels over ``window`` (default: first kernel
    start to last kernel end).

    >>> ks = [("gemm", 0, 40), ("ncclDevKernel_AllGather", 30, 60), ("gemm", 70, 100), ("nccl_RS", 100, 110)]
    >>> overlap(ks, window=(0, 120))  # us -> ms: 0.07 compute, 0.01 hidden, 0.03 exposed, 0.02 idle
    {'window_ms': 0.12, 'compute_ms': 0.07, 'comm_ms': 0.04, 'comm_hidden_ms': 0.01, 'comm_exposed_ms': 0.03, 'idle_ms': 0.02, 'kernels': 4, 'comm_kernels': 2}
    """
    kernels = list(kernels)
    if window is None:
        window = (min(k[1] for k in kernels), max(k[2] for k in kernels)) if kernels else (0.0, 0.0)
    lo, hi = window
    clip = lambda spans: [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]  # noqa: E731
    compute = union(clip((a, b) for n, a, b in kernels if not is_communication(n)))
    comm = union(clip((a, b) for n, a, b in kernels if is_communication(n)))
    exposed = _minus(comm, compute)
    busy = union(compute + comm)
    ms = lambda us: round(us / 1000, 3)  # noqa: E731
    return {
        "window_ms": ms(hi - lo),
        "compute_ms": ms(_length(compute)),
        "comm_ms": ms(_length(comm)),
        "comm_hidden_ms": ms(_length(comm) - _length(exposed)),
        "comm_exposed_ms": ms(_length(exposed)),
        "idle_ms": ms(hi - lo - _length(busy)),
        "kernels": len(kernels),
        "comm_kernels": sum(is_communication(k[0]) for k in kernels),
    }


def overlap_of_trace(path: Path, device: int | None = None) -> dict:
    """``overlap`` of a (gzipped) Chrome trace file's kernels on ``device``, over their whole span."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as handle:
        return overlap(kernel_events(json.load(handle), device))
