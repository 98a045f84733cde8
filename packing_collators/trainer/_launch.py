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
visible GPUs and no process group is an ordinary one-GPU set-up.

accelerate's ``DataLoaderDispatcher`` (``dispatch_batches``, on by default for an ``IterableDataset``) splits
the same way: every tensor of a batch along dim 0, so a packed row keeps ``cu_seq_lens_q/k[:1]`` (no sequence)
and, over several processes, the row goes to one of them. sdpa and eager number the examples from
``position_ids``, which a one-row slice keeps whole: exact on one process. Anything that reads the boundaries
(flash attention, ``packing_varlen``/``packing_fa4``, layers ``enable_packing`` prepared) is refused when training
begins, with ``dispatch_batches=False``. Cost: one attribute read.
"""

from __future__ import annotations

import os
import sys

__all__ = ["LaunchError", "refuse_data_parallel", "refuse_dispatched_rows"]


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


def refuse_dispatched_rows(dataloader, model, who: str) -> None:
    """Raise :class:`LaunchError` when accelerate dispatches ``dataloader``'s batches (slicing each tensor along dim 0)
    and the model reads what that slicing cuts: the boundaries (any attention but sdpa/eager/flex, or layers
    ``enable_packing`` prepared), or the row itself (several processes)."""
    try:
        from accelerate.data_loader import DataLoaderDispatcher
    except ImportError:  # pragma: no cover - accelerate comes with transformers' Trainer
        return
    if not isinstance(dataloader, DataLoaderDispatcher):
        return
    from .._compat import attn_implementation
    from .._model_unwrap import text_config
    from ..attention import attention_kind
    from ..models import packing_layers

    implementation = attn_implementation(text_config(model))
    processes = getattr(getattr(dataloader, "state", None), "num_processes", 1) or 1
    if attention_kind(implementation) == "position_ids" and packing_layers(model) is None and processes == 1:
        return
    raise LaunchError(
        f"{who}: accelerate dispatches this dataloader's batches (dispatch_batches, on by default for an "
        "IterableDataset): it slices every tensor of a batch along its first dimension, so a packed row's "
        "cu_seq_lens_q/k keep their first entry only"
        + (f" and the row goes to one of the {processes} processes" if processes > 1 else "")
        + f", where this model ({implementation!r} attention"
        + (", layers enable_packing prepared" if packing_layers(model) is not None else "")
        + ") reads them. Pass TrainingArguments(accelerator_config={\"dispatch_batches\": False}), which gives each "
        "process its own batches whole, or a map-style dataset."
    )
