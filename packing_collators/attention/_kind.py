"""How an attention implementation keeps packed examples apart, and what this library's backends lack.

    flash_attention_2/3/4, packing_varlen, packing_fa4   "cu_seq_lens"   (read from the batch)
    sdpa, eager, flex_attention                          "position_ids"  (transformers' packed mask)
    anything else                                        "unknown"       (refused)

A name registered with transformers' ``AttentionInterface`` to its flash forward, or to
this library's ``varlen``/``fa4`` backends, counts under its registered function.
Cost: a dictionary lookup.
"""

from __future__ import annotations

from .._compat import attention_registry

__all__ = ["FLASH_IMPLEMENTATIONS", "attention_kind", "check_backend_limits", "own_backend"]

FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
_MASKED = ("sdpa", "eager", "flex_attention")


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
        from transformers.integrations.flash_attention import flash_attention_forward
    except ImportError:  # pragma: no cover - transformers without these names
        return "unknown"
    if own_backend(implementation) is not None:
        return "cu_seq_lens"
    return (
        "cu_seq_lens"
        if attention_registry().get(implementation) is flash_attention_forward
        else "unknown"
    )


def own_backend(implementation: str | None) -> str | None:
    """``"varlen"`` or ``"fa4"`` where ``implementation`` is registered to one of this library's backends
    (under any name), else None: what each lacks is checked by that, not by name."""
    from ._fa4 import fa4_attention_forward
    from ._varlen import varlen_attention_forward

    registered = attention_registry().get(implementation)
    return {varlen_attention_forward: "varlen", fa4_attention_forward: "fa4"}.get(registered)


def check_backend_limits(config, implementation: str | None, name: str) -> None:
    """Refuse what this library's backend under ``implementation`` lacks for ``config`` (model ``name``):
    logit softcapping (``packing_varlen``), attention dropout (both). Other implementations pass.

    >>> from transformers import LlamaConfig
    >>> check_backend_limits(LlamaConfig(attention_dropout=0.1), "sdpa", "LlamaForCausalLM")
    """
    backend = own_backend(implementation)
    if backend is None:
        return
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
