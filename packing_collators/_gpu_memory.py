"""How much of a CUDA GPU this process may use: what the token budget is planned against."""

from __future__ import annotations

__all__ = ["usable_gpu_bytes"]


def usable_gpu_bytes(device) -> int:
    """The memory this process may allocate on CUDA ``device``: the card's, times the share that
    ``torch.cuda.set_per_process_memory_fraction`` set (a GPU shared with other processes), if any."""
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    share = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # absent from older torch
    return int(total * min(1.0, share(device))) if share is not None else total
