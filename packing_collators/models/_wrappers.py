"""PEFT adapters that cannot train packed: prompt learning (prompt, prefix and p-tuning), refused by name.

    padded batch   [P P P a a a]  [P P P b b .]      each example after its own virtual tokens P
    packed row     [P P P a a a b b]                 PEFT prepends P once per row: b trains without them,
                                                     position_ids are dropped, so a and b attend to each other

Prompt and p-tuning put their virtual tokens in front of each row of the batch, and drop
``position_ids``; prefix tuning hands every attention layer a prefix cache. A packed row is one
row of several examples: only its first example sees the prompt, and nothing keeps the examples
apart. Making it exact would mean a prompt per example inside the row, which PEFT does not do:
such a model is refused, with the fix (padded batches, or an adapter on the weights such as LoRA,
which packs exactly). Cost: a few attribute reads.
"""

from __future__ import annotations

__all__ = ["prompt_learning", "refuse_prompt_learning"]


def prompt_learning(model) -> str | None:
    """The PEFT type of ``model``'s active adapter when it is prompt learning (``"PROMPT_TUNING"``,
    ``"PREFIX_TUNING"``, ``"P_TUNING"``, ...), else None; looks through DDP-style ``.module`` wrappers."""
    for _ in range(4):
        config = getattr(model, "active_peft_config", None)  # a PeftModel's
        if config is not None:
            if not getattr(config, "is_prompt_learning", False):
                return None
            return str(getattr(config.peft_type, "value", config.peft_type))
        model = getattr(model, "module", None)
        if model is None:
            return None
    return None


def refuse_prompt_learning(model) -> None:
    """Raise a ValueError for a PEFT model whose active adapter is prompt learning."""
    kind = prompt_learning(model)
    if kind is None:
        return
    raise ValueError(
        f"This PEFT model trains a {kind} adapter, which packing cannot keep exact: PEFT adds its virtual tokens "
        "(or its prefix cache) once per row of the batch and drops position_ids, so in a packed row only the first "
        "example would see them and the examples would attend to each other. Train it with padded batches (a stock "
        "Trainer and a padding collator), or use an adapter on the weights (LoRA), which packs exactly."
    )
