"""Refuse, before training, the set-ups in which a packed batch would silently mix its examples.

A flattened row ``[S1 S1 S1 S2 S2 S3 S3 S3]`` is only correct if every attention
layer keeps ``S1``, ``S2`` and ``S3`` apart. What keeps them apart depends on the
attention implementation:

    flash_attention_2/3/4, packing_varlen   cu_seq_lens_q/k from the batch
    sdpa, eager, flex_attention             transformers' packed-sequence mask, rebuilt from
                                            position_ids, and only when there is neither an
                                            attention_mask nor a KV cache

and recurrent layers (Mamba-style, linear attention) need ``seq_idx`` too. Each
rule below was a silent wrong loss in practice, e.g. ``config.use_cache=True``
(the default of most checkpoints) makes transformers build a cache during
training, which switches the packed-sequence mask off for sdpa/eager/flex.
Cost: signature and config inspection plus, when a batch is given, a few numpy
ops over its ``position_ids``; run once before training, not per step.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["check_collated_features", "check_packing_support"]

logger = logging.getLogger(__name__)

FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
_MASKED = ("sdpa", "eager", "flex_attention")
_RECURRENT_MODEL_TYPES = frozenset(
    {
        "mamba",
        "mamba2",
        "falcon_mamba",
        "bamba",
        "jamba",
        "zamba",
        "zamba2",
        "falcon_h1",
        "nemotron_h",
        "granitemoehybrid",
        "rwkv",
        "recurrent_gemma",
        "lfm2",
        "qwen3_next",
        "olmo_hybrid",
    }
)
_RECURRENT_LAYER_WORDS = ("mamba", "linear", "recurrent", "conv", "ssm", "rwkv", "delta")


def _is_fsdp1(model) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(model, FullyShardedDataParallel)


def _strip_wrappers(model, *, keep_fsdp1: bool):
    for _ in range(4):
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif hasattr(model, "module") and (not hasattr(model, "config") or (not keep_fsdp1 and _is_fsdp1(model))):
            model = model.module  # DDP has no config; FSDP1 forwards its module's attributes, config included
        else:
            break
    return model


def unwrap_model(model):
    """The transformers model inside DDP / FSDP / PEFT wrappers (for its class, config and signature)."""
    return _strip_wrappers(model, keep_fsdp1=False)


def probe_module(model):
    """What the probe's forwards run through: DDP and PEFT wrappers stripped, FSDP (version 1) kept.

    A DDP forward with autograd on would wait for a backward that never comes; an FSDP1
    wrapper's forward is what gathers its sharded parameters (every rank runs the probe).
    FSDP2 shards the model in place, so the model is its own probe module.
    """
    return _strip_wrappers(model, keep_fsdp1=True)


def text_config(model):
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"check_packing_support needs a transformers model (with .config), got {type(model).__name__}.")
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def attention_kind(implementation: str | None) -> str:
    """How ``implementation`` keeps packed examples apart: ``"cu_seq_lens"``, ``"position_ids"`` or ``"unknown"``.

    >>> attention_kind("flash_attention_2"), attention_kind("sdpa"), attention_kind("my_kernel")
    ('cu_seq_lens', 'position_ids', 'unknown')
    """
    if implementation in FLASH_IMPLEMENTATIONS:
        return "cu_seq_lens"
    if implementation in _MASKED:
        return "position_ids"
    try:
        from transformers import AttentionInterface
        from transformers.integrations.flash_attention import flash_attention_forward
    except ImportError:  # pragma: no cover - transformers without these names
        return "unknown"
    if _own_backend(implementation) is not None:
        return "cu_seq_lens"
    return (
        "cu_seq_lens"
        if AttentionInterface._global_mapping.get(implementation) is flash_attention_forward
        else "unknown"
    )


def _own_backend(implementation: str | None) -> str | None:
    """``"varlen"`` or ``"fa4"`` where ``implementation`` is registered to one of this library's backends
    (under any name), else None: what each lacks is checked by that, not by name."""
    from transformers import AttentionInterface

    from ._fa4_attention import fa4_attention_forward
    from ._varlen_attention import varlen_attention_forward

    registered = AttentionInterface._global_mapping.get(implementation)
    return {varlen_attention_forward: "varlen", fa4_attention_forward: "fa4"}.get(registered)


def _is_recurrent(config) -> bool:
    if getattr(config, "model_type", None) in _RECURRENT_MODEL_TYPES:
        return True
    layer_types = getattr(config, "layer_types", None) or ()
    return any(isinstance(t, str) and any(w in t for w in _RECURRENT_LAYER_WORDS) for t in layer_types)


def _check_model(model) -> tuple[str, Any]:
    model = unwrap_model(model)
    config = text_config(model)
    params = inspect.signature(model.forward).parameters
    name = type(model).__name__
    if "position_ids" not in params:
        raise ValueError(
            f"{name}.forward takes no position_ids, so a packed batch cannot restart positions per example and "
            "its examples would attend to each other. Pack only models whose forward takes position_ids, or pad."
        )
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise ValueError(
            f"{name}.forward takes no **kwargs, so the batch's cu_seq_lens_q/k and max_length_q/k cannot reach "
            "its attention layers (and the Trainer cannot pass num_items_in_batch for token-weighted loss). "
            "Use a transformers model whose forward accepts **kwargs, or pad."
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, Mapping) and ("mrope_section" in rope or "mrope_interleaved" in rope):
        raise ValueError(
            f"{name} uses multimodal rope (mrope_section={rope.get('mrope_section')}), whose position_ids are "
            "(3, b, s) and built by the model from image/video grids; flattened batches carry (1, T) positions. "
            "Packing this model is not supported: pad its batches."
        )
    if getattr(config, "use_cache", False):
        raise ValueError(
            f"{name}: model.config.use_cache is True. During training that builds a KV cache, and with a cache "
            "transformers stops detecting packed sequences (sdpa/eager/flex then let examples attend to each other). "
            "Set model.config.use_cache = False before training (generation can turn it back on)."
        )
    implementation = getattr(config, "_attn_implementation", None)
    kind = attention_kind(implementation)
    if kind == "unknown":
        raise ValueError(
            f"{name} uses attn_implementation={implementation!r}, which is not known to honour packed boundaries "
            f"(cu_seq_lens or position_ids). Use one of {', '.join(FLASH_IMPLEMENTATIONS)}, 'packing_varlen' "
            "(register_varlen_attention()), 'flex_attention', 'sdpa' or 'eager'."
        )
    backend = _own_backend(implementation)
    if backend is not None:  # packing_varlen, packing_fa4: what their kernels lack
        if getattr(config, "attn_logit_softcapping", None) is not None and backend == "varlen":
            raise ValueError(
                f"{name} uses attention logit softcapping ({config.attn_logit_softcapping}), which PyTorch's varlen "
                "kernel lacks. Use attn_implementation='flash_attention_2' or 'flex_attention'."
            )
        if getattr(config, "attention_dropout", 0.0):
            raise ValueError(
                f"{name} has attention_dropout={config.attention_dropout}, which {implementation!r} lacks. "
                "Set model.config.attention_dropout = 0.0, or use attn_implementation='flash_attention_2'."
            )
    return implementation, config


def _numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _segments_from_positions(position_ids: np.ndarray) -> np.ndarray:
    """int64 (k + 1,) segment starts (and the end) that transformers' packed-mask detection sees."""
    row = position_ids.reshape(-1)
    new = np.flatnonzero(np.diff(row) != 1) + 1
    return np.r_[0, new, len(row)].astype(np.int64)


def _restarts(positions: np.ndarray, attention_mask) -> bool:
    """Whether positions restart inside a row (between two real tokens, when there is a mask)."""
    restart = np.diff(positions, axis=-1) != 1
    if attention_mask is not None:
        mask = _numpy(attention_mask).astype(bool).reshape(positions.shape)
        restart &= mask[:, 1:] & mask[:, :-1]
    return bool(restart.any())


def _check_batch(batch: Mapping[str, Any], implementation: str, config) -> None:
    kind = attention_kind(implementation)
    if batch.get("use_cache"):
        raise ValueError(
            "The batch sets use_cache=True; a cache switches off packed-sequence detection. Drop use_cache from the batch."
        )
    flat = "cu_seq_lens_q" in batch or "cu_seq_lens_k" in batch
    positions = batch.get("position_ids")
    if positions is not None:
        positions = _numpy(positions)
        if positions.ndim != 2 or (flat and positions.shape[0] != 1):
            raise ValueError(
                f"position_ids has shape {positions.shape}; a flattened batch has one row, (1, T). "
                "Use FlatteningCollator (and per_device_train_batch_size = examples per row)."
            )
        flat = flat or _restarts(positions, batch.get("attention_mask"))
    if not flat:
        return
    if batch.get("attention_mask") is not None:
        raise ValueError(
            "The batch is flattened (cu_seq_lens / restarting position_ids) and also has an attention_mask: "
            "transformers then ignores the packed boundaries for sdpa/eager/flex and unpads by the mask for flash, "
            "so examples attend to each other. Drop attention_mask from flattened batches (FlatteningCollator does)."
        )
    if positions is None:
        raise ValueError(
            "The batch is flattened (has cu_seq_lens) but has no position_ids: positions would run on across "
            "examples. Collate with FlatteningCollator, which returns position_ids restarting per example."
        )
    if "cu_seq_lens_q" in batch:
        cu = _numpy(batch["cu_seq_lens_q"]).astype(np.int64)
        if cu.ndim != 1 or cu[0] != 0 or cu[-1] != positions.size or np.any(np.diff(cu) < 0):
            raise ValueError(
                f"cu_seq_lens_q={cu.tolist()[:8]}... does not split the {positions.size} tokens of the batch "
                "(it must start at 0, never decrease and end at the token count)."
            )
        if kind == "position_ids" and not np.array_equal(
            _segments_from_positions(positions), cu[np.r_[True, np.diff(cu) > 0]]
        ):
            raise ValueError(
                f"position_ids do not restart where cu_seq_lens_q says examples start, and {implementation!r} "
                "separates examples by position_ids only, so they would attend to each other. "
                "Build position_ids and cu_seq_lens together (FlatteningCollator does)."
            )
    elif kind == "cu_seq_lens" and positions.shape[0] > 1:
        raise ValueError(
            f"The batch has {positions.shape[0]} rows whose position_ids restart (packed rows) and no cu_seq_lens_q/k, "
            f"and {implementation!r} keeps examples apart only in a one-row batch (it reads cu_seq_lens, or derives "
            "them from position_ids when there is one row): the examples of each row would attend to each other. "
            "Collate with PrePackedCollator(mode='flatten') (or FlatteningCollator); mode='pad' is for sdpa/eager/flex."
        )
    elif _own_backend(implementation) is not None:
        raise ValueError(
            f"attn_implementation={implementation!r} needs cu_seq_lens_q/k and max_length_q/k in the batch; "
            "collate with FlatteningCollator."
        )
    if _is_recurrent(config) and batch.get("seq_idx") is None:
        raise ValueError(
            "This model has recurrent (Mamba-style / linear-attention) layers, which carry state across the whole "
            "row unless the batch has seq_idx. Collate with FlatteningCollator(return_seq_idx=True)."
        )


def check_packing_support(
    model, batch: Mapping[str, Any] | None = None, *, collator=None, probe: bool = True, autocast=None
) -> str:
    """Raise a ValueError saying what to change if ``model`` (and ``batch``) cannot train packed safely.

    Static checks first (fast, with the clearest messages): the model's forward takes
    ``position_ids`` and ``**kwargs``, ``use_cache`` is off, no multimodal rope, the kernel
    limits of ``packing_varlen``; and, when a collated ``batch`` is given, every row of it:
    no ``attention_mask`` beside a packed layout, ``position_ids`` that restart where
    ``cu_seq_lens`` says, no multi-row packed batch under flash attention (which needs one
    row), ``seq_idx`` for recurrent layers. Then, with ``probe=True`` (default), the live
    equivalence probe (:func:`probe_packing`): synthetic examples collated by ``collator``
    (default :class:`FlatteningCollator`), run packed and alone on the model as it is
    (attention implementation, dtype, device); a model whose packed outputs differ, or
    whose examples see each other, is refused with the measured numbers. ``autocast``
    is a context manager for the probe's forwards (the Trainer's mixed precision).
    Returns the attention implementation.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    >>> model = LlamaForCausalLM(config)
    >>> check_packing_support(model)
    Traceback (most recent call last):
    ...
    ValueError: LlamaForCausalLM: model.config.use_cache is True. During training that builds a KV cache, and with a cache transformers stops detecting packed sequences (sdpa/eager/flex then let examples attend to each other). Set model.config.use_cache = False before training (generation can turn it back on).
    >>> model.config.use_cache = False
    >>> check_packing_support(model)
    'sdpa'
    """
    implementation, config = _check_model(model)
    if batch is not None:
        _check_batch(batch, implementation, config)
    elif _is_recurrent(config):
        raise ValueError(
            f"{type(unwrap_model(model)).__name__} has recurrent (Mamba-style / linear-attention) layers, which need "
            "seq_idx in every packed batch; pass a collated batch: check_packing_support(model, batch) "
            "(FlatteningCollator(return_seq_idx=True) makes one)."
        )
    if probe:
        from ._probe import probe_packing, refuse_failed_probe

        report = probe_packing(probe_module(model), collator, autocast=autocast)
        logger.info("%s", report.summary())
        refuse_failed_probe(report, attention_kind(implementation))
    return implementation


def _inner_starts(feature) -> np.ndarray:
    """Where examples start inside one feature: 0, and inside a pre-packed row (seq_lengths / position_ids)."""
    if feature.get("seq_lengths") is not None:
        inner = np.cumsum(_numpy(feature["seq_lengths"]))[:-1]
    elif feature.get("position_ids") is not None:
        inner = np.flatnonzero(np.diff(_numpy(feature["position_ids"]).reshape(-1)) != 1) + 1
    else:
        inner = np.empty(0, np.int64)
    return np.r_[0, inner].astype(np.int64)


def _row_starts(batch: Mapping[str, Any], row: int) -> np.ndarray:
    """Where segments start in one row of the collated batch (cu_seq_lens for one row, else position_ids)."""
    if batch.get("cu_seq_lens_q") is not None and _numpy(batch["input_ids"]).shape[0] == 1:
        cu = _numpy(batch["cu_seq_lens_q"]).astype(np.int64)
        return cu[:-1][np.diff(cu) > 0]
    if batch.get("position_ids") is not None:
        positions = _numpy(batch["position_ids"])
        return _segments_from_positions(positions.reshape(-1, positions.shape[-1])[row])[:-1]
    return np.zeros(1, np.int64)  # nothing in the batch separates examples within a row


def _joined_error(token: int, row: int | None, have: np.ndarray, prepacked: bool) -> ValueError:
    where = f"token {token} of the batch" if row is None else f"token {token} of row {row}"
    hint = (
        " The dataset looks pre-packed (rows carry position_ids or seq_lengths, e.g. from pack_dataset), and this "
        "collator dropped what separates a row's examples (as transformers' DataCollatorWithPadding and TRL's default "
        "collator do) or treats each row as one example. Collate with PrePackedCollator, or train on the unpacked "
        "dataset (FlatteningCollator / PackingTrainer pack it per batch)."
        if prepacked
        else " Use FlatteningCollator, which starts a segment at every example."
    )
    return ValueError(
        f"The collator joined examples that the dataset keeps apart: an example starts at {where}, but the batch has "
        f"no boundary there (its segments start at {have.tolist()[:8]})." + hint
    )


def check_collated_features(features, batch: Mapping[str, Any]) -> None:
    """Raise a ValueError if the collated ``batch`` joins examples that ``features`` keep apart.

    Every feature starts an example, and a pre-packed feature (``seq_lengths`` or
    restarting ``position_ids``, as ``pack_dataset`` writes) starts several; each of
    those starts must start a segment of the batch too: of its one flattened row
    (``cu_seq_lens`` or restarting ``position_ids``), or, when the batch has a row per
    feature, of that feature's row (restarting ``position_ids``). A batch whose rows do
    not map to the features (neither one row nor one per feature) is not checked.

    >>> prepacked = [{"input_ids": [1, 2, 3, 4], "position_ids": [0, 1, 0, 1]}]
    >>> check_collated_features(prepacked, {"input_ids": np.zeros((1, 4)), "cu_seq_lens_q": np.array([0, 2, 4])})
    >>> check_collated_features(prepacked * 2, {"input_ids": np.zeros((2, 4)), "attention_mask": np.ones((2, 4))})
    Traceback (most recent call last):
    ...
    ValueError: The collator joined examples that the dataset keeps apart: an example starts at token 2 of row 0, but the batch has no boundary there (its segments start at [0]). The dataset looks pre-packed (rows carry position_ids or seq_lengths, e.g. from pack_dataset), and this collator dropped what separates a row's examples (as transformers' DataCollatorWithPadding and TRL's default collator do) or treats each row as one example. Collate with PrePackedCollator, or train on the unpacked dataset (FlatteningCollator / PackingTrainer pack it per batch).
    """
    ids = batch.get("input_ids")
    if ids is None or _numpy(ids).ndim != 2:
        return
    rows = _numpy(ids).shape[0]
    prepacked = any(f.get("seq_lengths") is not None or f.get("position_ids") is not None for f in features)
    if rows == 1:
        lengths = [len(f["input_ids"]) for f in features]
        offsets = np.r_[0, np.cumsum(lengths)[:-1]]
        want = np.concatenate([_inner_starts(f) + o for f, o in zip(features, offsets)]) if features else np.zeros(0)
        have = _row_starts(batch, 0)
        missing = np.setdiff1d(want, have)
        if len(missing):
            raise _joined_error(int(missing[0]), None, have, prepacked)
    elif rows == len(features):
        for row, feature in enumerate(features):
            have = _row_starts(batch, row)
            missing = np.setdiff1d(_inner_starts(feature), have)
            if len(missing):
                raise _joined_error(int(missing[0]), row, have, prepacked)
