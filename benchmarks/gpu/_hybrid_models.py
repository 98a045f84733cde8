"""The hybrid models ``hybrid_throughput.py`` runs: one config per ``--model``, full-size or ``--smoke`` tiny.

    --model            shape                                                    stateful layers
    qwen3_5            Qwen3.5-0.8B's text model: hidden 1024, 24 layers,       Gated DeltaNet x18
                       3 Gated DeltaNet : 1 attention, vocab 248,320
    nemotron_h         Nemotron-H-like 0.8B: hidden 1536, 24 blocks (Mamba2,     Mamba2 x9, 48 heads x 64,
                       MLP, ..., attention every 4th pair), vocab 131,072       8 groups, state 128
    granitemoehybrid   Granite-4.0-H-Tiny's widths, dense (no experts): hidden   Mamba2 x18, 48 heads x 64,
                       1536, 20 layers, 9 Mamba2 : 1 attention (no positions),  1 group, state 128
                       shared MLP 4096, vocab 100,352
    lfm2               LFM2-1.2B: hidden 2048, 16 layers (10 short convs,       short conv x10 (3 taps)
                       6 attention), MLP 8192, vocab 65,536

``--layers N`` keeps the first N layers of the pattern (the same widths and mix, less time): the
GPU plan uses it to fit three models in one device call. Random weights; bf16 on the GPU.
"""

from __future__ import annotations

LFM2_1_2B_ATTENTION = (2, 5, 8, 10, 12, 14)  # LiquidAI/LFM2-1.2B's full_attn_idxs


def _cut(pattern: list[str], layers: int | None) -> list[str]:
    return pattern if layers is None else pattern[:layers]


def qwen3_5_config(smoke: bool, layers: int | None = None):
    from transformers import Qwen3_5TextConfig

    if smoke:
        sizes = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     intermediate_size=128, linear_num_key_heads=2, linear_num_value_heads=4,
                     linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=512)  # fmt: skip
        pattern = _cut(["linear_attention"] * 3 + ["full_attention"], layers)
        return Qwen3_5TextConfig(**sizes, num_hidden_layers=len(pattern), layer_types=pattern, use_cache=False)
    pattern = _cut((["linear_attention"] * 3 + ["full_attention"]) * 6, layers)
    return Qwen3_5TextConfig(  # Qwen3.5-0.8B's text model
        vocab_size=248320, hidden_size=1024, num_hidden_layers=len(pattern), num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, intermediate_size=3584, linear_num_key_heads=16,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        layer_types=pattern, tie_word_embeddings=True, use_cache=False, max_position_embeddings=32768,
    )  # fmt: skip


def nemotron_h_config(smoke: bool, layers: int | None = None):
    from transformers import NemotronHConfig

    pattern = ["linear_attention", "mlp"] * 3 + ["full_attention", "mlp"]  # Mamba2, MLP, ..., attention, MLP
    if smoke:
        sizes = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                     mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, vocab_size=512)  # fmt: skip
        return NemotronHConfig(**sizes, layers_block_type=_cut(pattern, layers), use_cache=False)
    return NemotronHConfig(
        vocab_size=131072, hidden_size=1536, layers_block_type=_cut(pattern * 3, layers), num_attention_heads=12,
        num_key_value_heads=4, head_dim=128, intermediate_size=6144, mamba_num_heads=48, mamba_head_dim=64,
        n_groups=8, ssm_state_size=128, conv_kernel=4, expand=2, use_cache=False, max_position_embeddings=32768,
    )  # fmt: skip


def granitemoehybrid_config(smoke: bool, layers: int | None = None):
    from transformers import GraniteMoeHybridConfig

    if smoke:
        pattern = _cut(["mamba"] * 3 + ["attention"], layers)
        return GraniteMoeHybridConfig(
            vocab_size=512, hidden_size=64, num_hidden_layers=len(pattern), layer_types=pattern, num_attention_heads=4,
            num_key_value_heads=2, shared_intermediate_size=128, num_local_experts=0, mamba_n_heads=8,
            mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=64, position_embedding_type="nope",
            use_cache=False,
        )  # fmt: skip
    pattern = _cut((["mamba"] * 9 + ["attention"]) * 2, layers)
    return GraniteMoeHybridConfig(  # granite-4.0-h-tiny's widths, its experts left out (dense, as granite-4.0-h-micro)
        vocab_size=100352, hidden_size=1536, num_hidden_layers=len(pattern), layer_types=pattern,
        num_attention_heads=12, num_key_value_heads=4, shared_intermediate_size=4096, num_local_experts=0,
        mamba_n_heads=48, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=256,
        position_embedding_type="nope", use_cache=False, max_position_embeddings=32768, tie_word_embeddings=True,
    )  # fmt: skip


def lfm2_config(smoke: bool, layers: int | None = None):
    from transformers import Lfm2Config

    if smoke:
        pattern = _cut(["conv", "conv", "full_attention", "conv"], layers)
        return Lfm2Config(
            vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=len(pattern), layer_types=pattern,
            num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3, use_cache=False,
        )  # fmt: skip
    pattern = _cut(["full_attention" if i in LFM2_1_2B_ATTENTION else "conv" for i in range(16)], layers)
    return Lfm2Config(  # LiquidAI/LFM2-1.2B
        vocab_size=65536, hidden_size=2048, intermediate_size=12288, num_hidden_layers=len(pattern),
        layer_types=pattern, num_attention_heads=32, num_key_value_heads=8, conv_L_cache=3,
        block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0, block_multiple_of=256, use_cache=False,
        max_position_embeddings=32768, tie_word_embeddings=True,
    )  # fmt: skip


CONFIGS = {
    "qwen3_5": qwen3_5_config,
    "nemotron_h": nemotron_h_config,
    "granitemoehybrid": granitemoehybrid_config,
    "lfm2": lfm2_config,
}
