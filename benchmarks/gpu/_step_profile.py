"""One training step under torch.profiler (scale_8b.py ``--profile-step``): its trace, and where its GPU time went.

    start_profile(cuda)  ...one step...  stop_profile(profiler, args, rank, step_seconds)
        -> {"step", "step_ms", "rank", "window_ms", "compute_ms", "comm_ms", "comm_hidden_ms", "comm_exposed_ms",
            "idle_ms", "kernels", "comm_kernels"}          (``_trace_overlap.overlap`` of this rank's GPU kernels)

Exporting a Chrome trace of an 8B step takes seconds: profile a step that is not timed.
"""

from __future__ import annotations

from pathlib import Path

import torch

PROFILE_SPLIT = ("step_ms", "window_ms", "compute_ms", "comm_ms", "comm_hidden_ms", "comm_exposed_ms", "idle_ms")


def start_profile(cuda: bool):
    """A running torch.profiler over the CPU and, on CUDA, the GPU's kernels."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    profiler = profile(activities=activities)
    profiler.__enter__()
    return profiler


def stop_profile(profiler, args, rank: int, step_seconds: float) -> dict:
    """Stop; where the step's GPU time went (``_trace_overlap.overlap``, this rank's GPU); rank 0 keeps the trace
    as <out>/<name>_trace.json.gz (``args``: scale_8b.py's)."""
    import gzip
    import shutil
    import tempfile

    from _trace_overlap import overlap_of_trace

    profiler.__exit__(None, None, None)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        profiler.export_chrome_trace(str(raw))
        device = torch.cuda.current_device() if torch.cuda.is_available() and not args.smoke else None
        summary = {"step": args.profile_step, "step_ms": round(step_seconds * 1000, 1), "rank": rank,
                   **overlap_of_trace(raw, device)}  # fmt: skip
        if rank == 0 and args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            with raw.open("rb") as src, gzip.open(args.out / f"{args.name}_trace.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
    print(f"profile of step {args.profile_step}, rank {rank}: {summary}", flush=True)
    return summary
