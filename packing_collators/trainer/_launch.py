"""One process driving several GPUs (``python train.py`` on a multi-GPU machine), refused before training.

Started without ``torchrun`` or ``accelerate launch``, transformers' Trainer sees every visible GPU
from one process (``TrainingArguments.n_gpu > 1``, no process group) and wraps the model in
``torch.nn.DataParallel``, which splits each batch along dim 0::

    packed batch         input_ids (1, T)   cu_seq_lens_q/k (n + 1,)
    DataParallel, 2 GPUs replica 0: input_ids (1, T), cu_seq_lens[: (n + 2) // 2]   <- half the boundaries
                         replica 1: idle (no row left for it)
    Trainer              num_items_in_batch // n_gpu  -> the loss and gradients n_gpu times too large

Nothing of that can be exact, so ``PackingTrainer`` (at construction) and ``PackingCheckCallback``
(when training begins) refuse it with the two launches that are: one process per GPU, or one GPU.
The collators do not warn: they cannot tell a Trainer run from a user's own loop, where several
visible GPUs and no process group is an ordinary one-GPU set-up. Cost: one attribute read.
"""

from __future__ import annotations

import os
import sys

__all__ = ["LaunchError", "refuse_data_parallel"]


class LaunchError(ValueError, RuntimeError):
    """A launch that cannot train packed batches exactly (a ``ValueError``, and a ``RuntimeError`` for
    code that catches set-up failures as such)."""


def _script() -> str:
    """The script the user started (``examples/sft_flattening.py``), or ``train.py`` when it is not one."""
    started = sys.argv[0] if sys.argv else ""
    return started if started.endswith(".py") and os.path.basename(started) != "__main__.py" else "train.py"


def refuse_data_parallel(args, who: str) -> None:
    """Raise :class:`LaunchError` when ``args`` (``TrainingArguments``) has one process drive several GPUs.

    transformers sets ``n_gpu`` to 1 under torchrun, accelerate launch and model parallelism
    (``device_map`` over GPUs); above 1, the Trainer wraps the model in ``torch.nn.DataParallel``.

    >>> from types import SimpleNamespace
    >>> refuse_data_parallel(SimpleNamespace(n_gpu=1), "PackingTrainer")
    >>> refuse_data_parallel(SimpleNamespace(n_gpu=2), "PackingTrainer")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    packing_collators.trainer._launch.LaunchError: PackingTrainer: this one process sees 2 GPUs ...
    """
    gpus = getattr(args, "n_gpu", 1) or 0
    if gpus <= 1:
        return
    script = _script()
    raise LaunchError(
        f"{who}: this one process sees {gpus} GPUs (TrainingArguments.n_gpu={gpus}: started without torchrun "
        "or accelerate launch, so no process group), and the Trainer would wrap the model in "
        "torch.nn.DataParallel, which cannot train a packed batch: the batch is one row, so one GPU would get "
        f"all of it, the loss would come out {gpus}x too large, and DataParallel's scatter would split "
        "cu_seq_lens_q/k between the GPUs. "
        f"Start one process per GPU: `torchrun --nproc-per-node {gpus} {script}` (or "
        f"`accelerate launch --num-processes {gpus} {script}`); or train on one GPU: "
        f"`CUDA_VISIBLE_DEVICES=0 python {script}`."
    )
