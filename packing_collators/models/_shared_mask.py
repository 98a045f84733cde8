"""The dense mask of a shared-prompt batch (``batch.SharedPromptLayout``), for attentions that read masks (sdpa, eager).

    kv_index, q_index, cu_seq_lens_k  --keys_layout_mask-->  bool (1, 1, T, T): each row token's visible row tokens
    the model's sliding windows       --_windowed-->         the same, limited to the window (per layer type)
    sdpa: bool; eager: additive in the model's dtype         -> the batch's ``attention_mask``

A varlen kernel reads the layout itself (``kv_index``); sdpa/eager need this mask, which replaces the model's
causal (and sliding) one, so it slides the model's window too. Cost: a (T, T) mask per batch (per layer type).
"""

from __future__ import annotations

import functools
import importlib
import inspect

import torch

from ..batch import CU_SEQ_LENS_K, KV_INDEX, Q_INDEX
from ._packed_mask import keys_layout_mask

__all__ = ["SHARED_ATTENTION", "shared_mask", "sliding_windows", "with_shared_mask"]

# the attention implementations that keep a shared prompt's layout: the keys gathered (varlen), or the dense mask
SHARED_ATTENTION = ("packing_varlen", "packing_fa4", "sdpa", "eager")


def shared_mask(batch: dict) -> torch.Tensor:
    """bool (1, 1, T, T): which row tokens each row token may attend to in the shared layout (sdpa/eager).

    >>> from packing_collators.collate import shared_prompt_batch
    >>> chosen = {"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}
    >>> rejected = {"input_ids": [1, 2, 4], "labels": [-100, -100, 4]}
    >>> shared_mask(shared_prompt_batch([[chosen, rejected]]))[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
    """
    return keys_layout_mask(batch[KV_INDEX], batch[Q_INDEX], batch[CU_SEQ_LENS_K])


def sliding_windows(config) -> tuple[dict[str, int | None] | None, int | None]:
    """(layer type -> window, the window of every layer): how ``config``'s attention layers limit how far back a
    token sees. With ``layer_types``, a mask per type: the window on ``sliding_attention`` layers (Gemma 2/3; Qwen2
    and Qwen3, whose code names such layers, slide none where every layer is full), or, where the modeling code
    names no sliding layer and ``sliding_window`` is set, on the ``full_attention`` ones (MiniMax, whose window is
    model-wide); else ``sliding_window`` for every layer (Mistral, Mixtral), or (None, None). A
    trainer's check before training measures the result on its longest sequences. A model whose modeling code never
    reads ``sliding_window`` (Nemotron-H's config has the field, its attention ignores it) slides nothing.

    >>> from transformers import Gemma2Config, MiniMaxConfig, MistralConfig, NemotronHConfig, Qwen2Config
    >>> sliding_windows(Gemma2Config(sliding_window=8, num_hidden_layers=2))
    ({'sliding_attention': 8, 'full_attention': None}, None)
    >>> sliding_windows(MiniMaxConfig(sliding_window=8, num_hidden_layers=2))
    ({'full_attention': 8, 'linear_attention': None}, None)
    >>> sliding_windows(MistralConfig(sliding_window=8)), sliding_windows(Qwen2Config())
    ((None, 8), (None, None))
    >>> sliding_windows(NemotronHConfig(sliding_window=8))
    (None, None)
    >>> sliding_windows(Qwen2Config(use_sliding_window=True, sliding_window=8, num_hidden_layers=2))  # both full
    (None, None)
    >>> sliding_windows(Qwen2Config(use_sliding_window=True, sliding_window=8, num_hidden_layers=2, max_window_layers=1))
    ({'full_attention': None, 'sliding_attention': 8}, None)
    """
    window = getattr(config, "sliding_window", None)
    source = _modeling_source(getattr(config, "model_type", ""))
    if not window or (source is not None and "sliding_window" not in source):
        return None, None
    kinds = list(dict.fromkeys(getattr(config, "layer_types", None) or []))
    # a model whose code names its sliding layers slides only those (Qwen2 with every layer full slides none)
    names_sliding = "sliding_attention" in kinds or (source is not None and '"sliding_attention"' in source)
    windowed = "sliding_attention" if names_sliding else "full_attention"
    per_type = {kind: int(window) if kind == windowed else None for kind in kinds}
    if len(kinds) <= 1:
        return None, (int(window) if not kinds or per_type[kinds[0]] else None)
    return per_type, None


@functools.lru_cache(maxsize=None)
def _modeling_source(model_type: str) -> str | None:
    """The source of transformers' modeling module of ``model_type`` (None where it cannot be read: the window is
    then applied as the config gives it, and the trainers' checks measure the outcome)."""
    try:
        return inspect.getsource(importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}"))
    except (ImportError, OSError, TypeError):
        return None


def _windowed(mask: torch.Tensor, batch: dict, window: int | None) -> torch.Tensor:
    """``mask`` with each token seeing only the keys less than ``window`` positions back (transformers' sliding
    window: ``kv > q - window``), positions read from the shared layout (R continues its prompt's)."""
    if window is None:
        return mask
    positions = batch["position_ids"].reshape(-1).to(mask.device)
    return mask & (positions[None, :] > positions[:, None] - window)[None, None]


def with_shared_mask(batch: dict, implementation: str, dtype, config=None) -> dict:
    """``batch`` with the dense ``attention_mask`` a position-based attention needs for the shared layout
    (sdpa: bool; eager: additive, in ``dtype``); a varlen kernel reads ``kv_index`` instead. With a text
    ``config`` whose layers slide a window, the mask slides it too: one mask for every layer (Mistral), or a
    mask per layer type (Gemma 2/3 take ``attention_mask`` as that mapping)."""
    if KV_INDEX not in batch or implementation not in ("sdpa", "eager"):
        return batch
    mask = shared_mask(batch)
    per_type, every = sliding_windows(config) if config is not None else (None, None)

    def finish(found: torch.Tensor) -> torch.Tensor:
        if implementation == "sdpa":
            return found
        return torch.zeros(found.shape, dtype=dtype, device=found.device).masked_fill(~found, torch.finfo(dtype).min)

    if per_type is not None:
        return {**batch, "attention_mask": {kind: finish(_windowed(mask, batch, w)) for kind, w in per_type.items()}}
    return {**batch, "attention_mask": finish(_windowed(mask, batch, every))}
