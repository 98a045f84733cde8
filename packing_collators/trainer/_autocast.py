"""The autocast the Trainer trains under (``bf16`` / ``fp16``), for what runs the model outside its steps.

    TrainingArguments(bf16=True)  ->  autocast_dtype: torch.bfloat16  ->  training_autocast: torch.autocast(...)

The live probe's forwards and the token budget's dry runs run under it, as the training steps do
(float32 weights and half activations: what a flash kernel needs, and what training holds).
Cost: none until used.
"""

from __future__ import annotations

__all__ = ["autocast_dtype", "training_autocast"]


def autocast_dtype(args):
    """The dtype the Trainer autocasts the forward to (``bf16`` / ``fp16``), or None.

    >>> from types import SimpleNamespace
    >>> autocast_dtype(SimpleNamespace(bf16=True, fp16=False)), autocast_dtype(SimpleNamespace(bf16=False, fp16=False))
    (torch.bfloat16, None)
    """
    if not (getattr(args, "bf16", False) or getattr(args, "fp16", False)):
        return None
    import torch

    return torch.bfloat16 if args.bf16 else torch.float16


def training_autocast(args, model):
    """The autocast the Trainer trains ``model`` under, as a context manager; None without."""
    dtype = autocast_dtype(args)
    if dtype is None:
        return None
    import torch

    parameter = next(model.parameters(), None)
    device = parameter.device.type if parameter is not None else "cpu"
    return torch.autocast(device_type=device, dtype=dtype)
