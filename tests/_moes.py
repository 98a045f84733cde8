"""Tiny mixture-of-experts causal LMs routed as their checkpoints route: 8 experts, 2 per token.

Built by the architecture sweep's ``build_tiny`` (``benchmarks/_architectures.py``), float32 on the CPU,
seeded, in eval mode, with ``use_cache`` left at the config's default (True, as checkpoints have it).
``MOES`` lists the types this transformers has (Qwen3-MoE, Mixtral, OLMoE, GLM-4.5 and Nemotron-H among them).
"""

from __future__ import annotations

from _hybrids import sweep

CANDIDATES = (
    "qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "granitemoe", "glm4_moe", "ernie4_5_moe", "phimoe",
    "qwen3_5_moe_text", "qwen3_next", "nemotron_h", "minimax", "hunyuan_v1_moe",
)  # fmt: skip
ROUTING = dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 8)


def _available() -> dict[str, str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return {t: MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t] for t in CANDIDATES if t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}


MOES = _available()


def tiny_moe(model_type: str, *, attn: str = "sdpa", seed: int = 0):
    """A tiny float32 ``model_type`` with 8 experts, 2 per token, ``use_cache`` as its config class has it."""
    model = sweep.build_tiny(model_type, MOES[model_type], seed=seed, overrides=ROUTING, defaults=("use_cache",))
    model.set_attn_implementation(attn)
    return model
