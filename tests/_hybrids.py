"""Tiny hybrid models (recurrent / convolutional layers beside attention) of the installed transformers.

Built by ``build_tiny`` of ``benchmarks/_architectures.py`` (the one home of the tiny configs, hybrids'
state sizes included, shared with ``scripts/architecture_sweep.py``), float32 on the CPU, seeded.
``HYBRIDS`` lists the hybrid causal LMs this transformers has; a type it lacks is not listed (and not tested).
"""

from __future__ import annotations

import _architectures as sweep  # benchmarks/ is on sys.path (conftest.py): the tiny configs and the sweep's rows
import torch

# Gated DeltaNet, Mamba2, Mamba, short convolutions, KDA, lightning attention, RG-LRU, n-gram PLE.
CANDIDATES = (
    "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmo_hybrid", "lara_mini", "qwen4_exp_text",
    "nemotron_h", "falcon_h1", "granitemoehybrid", "bamba", "zamba", "zamba2", "jamba",
    "lfm2", "lfm2_moe", "lfm3", "kimi_linear", "bailing_hybrid", "minimax", "recurrent_gemma",
)  # fmt: skip


def _available() -> dict[str, str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return {t: MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t] for t in CANDIDATES if t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}


HYBRIDS = _available()


def tiny_hybrid(model_type: str, *, attn: str = "sdpa", seed: int = 0, defaults: tuple[str, ...] = ()):
    """A tiny float32 ``model_type`` in eval mode, ``use_cache=False`` (unless ``defaults`` names it: the
    config's default, as a checkpoint has it), with ``attn``."""
    model = sweep.build_tiny(model_type, HYBRIDS[model_type], seed=seed, defaults=defaults)
    model.set_attn_implementation(attn)
    return model


def examples_for(model, lengths=(7, 12, 5, 9), seed: int = 0) -> list[dict]:
    return sweep.random_examples(model.config, lengths, seed=seed)


def alone_logits(model, examples: list[dict]) -> torch.Tensor:
    """(sum of lengths, vocab): each example run alone, one batch of one, concatenated."""
    return torch.cat([model(input_ids=torch.tensor([e["input_ids"]])).logits[0] for e in examples])
