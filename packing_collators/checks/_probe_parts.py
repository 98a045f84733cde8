"""What both live probes share (``probe_packing`` here, ``probe_sequence_parallel`` in ``parallel/``).

    PROBE_LENGTHS          the synthetic examples' lengths: (7, 5, 9), the middle one changed
    synthetic_tokens       random ids that avoid the special tokens (a pad id can move embeddings)
    model_inputs           a collated batch on the model's device, without its targets
    output_logits          the logits tensor of a model's output
    probe_dtype, tolerance the dtype the forwards ran in, and |packed - alone| allowed for it

Cost: a numpy draw over at most 4,096 token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..batch import TARGET_KEYS

__all__ = ["PROBE_LENGTHS", "model_inputs", "output_logits", "probe_dtype", "synthetic_tokens", "tolerance"]

PROBE_LENGTHS = (7, 5, 9)
# |packed - alone| allowed, relative to the largest logit (at least 1): float32 kernels agree
# to ~1e-6, bf16 ones to ~1e-2.
_TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "bfloat16": 5e-2, "float16": 2e-2}


def synthetic_tokens(config, lengths: Sequence[int], seed: int, avoid: Sequence[int] = ()) -> list[np.ndarray]:
    """Random token ids, one int64 array per length, avoiding the special tokens of ``config`` (and ``avoid``).

    >>> from transformers import LlamaConfig
    >>> [ids.tolist() for ids in synthetic_tokens(LlamaConfig(vocab_size=16, pad_token_id=0), [3, 2], seed=0)]
    [[14, 11, 9], [6, 7]]
    """
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 8:
        raise ValueError(f"The packing probe needs a model with a vocabulary (config.vocab_size={vocab}).")
    special = set(avoid)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):  # eos may be a list (Llama 3.1 Instruct, GLM-4)
        value = getattr(config, key, None)
        special.update(value if isinstance(value, (list, tuple)) else [value])
    allowed = np.array([t for t in range(min(vocab, 4096)) if t not in special], np.int64)
    rng = np.random.default_rng(seed)
    return [rng.choice(allowed, size=n) for n in lengths]


def model_inputs(batch: dict, device) -> dict:
    """The batch's inputs as tensors on ``device``; its targets (``labels``, ``shift_labels``) left out."""
    import torch

    inputs = {}
    for key, value in batch.items():
        if key in TARGET_KEYS:
            continue
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        inputs[key] = value.to(device) if hasattr(value, "to") else value
    return inputs


def output_logits(output):
    """The logits of a model's output: ``output.logits``, else its first element."""
    return output.logits if hasattr(output, "logits") else output[0]


def probe_dtype(autocast, parameter) -> str:
    """The dtype the probe's forwards ran in: autocast's, else the parameters' (``"bfloat16"``)."""
    return str(getattr(autocast, "fast_dtype", None) or parameter.dtype).replace("torch.", "")


def tolerance(dtype: str, reference: np.ndarray) -> float:
    """The largest |packed - alone| logit difference accepted in ``dtype``, scaled by ``reference``'s largest logit.

    >>> tolerance("float32", np.array([0.5, -2.0]))
    0.0002
    """
    return _TOLERANCE.get(dtype, 5e-2) * max(1.0, float(np.abs(reference).max()))
