"""Which layers of a model carry state along the sequence, found by their structure, not their class name.

    Qwen3_5GatedDeltaNet       conv1d (depthwise, causal) + A_log, dt_bias     Gated DeltaNet
    NemotronHMamba2Mixer       conv1d + A_log, D, dt_bias                      Mamba2
    JambaMambaMixer            conv1d + A_log, D                               Mamba
    Lfm2MoeShortConv           conv (depthwise, causal)                        short convolution
    KimiLinearDeltaAttention   conv1d + forget_gate.A_log                      KDA
    MiniMaxLightningAttention  slope_rate, *_decay buffers                     lightning (decayed linear) attention
    RecurrentGemmaRecurrentBlock  conv_1d + rg_lru.recurrent_param             RG-LRU
    Inkling2DynamicShortConvolution  conv_kernel_size + its taps (K, hidden)   short convolution, taps per token

A module is such a layer when one of its own children is a depthwise 1-D convolution (the short
causal convolution every one of these families starts with), when it owns, itself, a parameter or
buffer of a recurrence (``A_log``, ``recurrent_param``, ``slope_rate``, ...), or when it has a
``conv_kernel_size`` and owns a parameter with that many taps (a convolution written without
``Conv1d``); the outermost such module is the layer. Attention that reads ``cu_seq_lens``/positions is not one: it keeps examples
apart by itself. Cost: one walk over the modules.
"""

from __future__ import annotations

__all__ = ["STATE_NAMES", "find_stateful_layers", "is_short_convolution"]

# Parameters and buffers that hold a recurrence's decay or state, as transformers' hybrid layers name them.
STATE_NAMES = frozenset({"A_log", "dt_bias", "recurrent_param", "slope_rate", "query_decay", "key_decay"})


def is_short_convolution(module) -> bool:
    """A depthwise 1-D convolution over the sequence (kernel > 1): the causal short conv of SSM / linear layers."""
    import torch

    if not isinstance(module, torch.nn.Conv1d):
        return False
    kernel = module.kernel_size[0]
    return kernel > 1 and module.groups == module.in_channels and module.groups > 1


def _owns_state(module) -> bool:
    own = dict(module.named_parameters(recurse=False))
    own.update(module.named_buffers(recurse=False))
    if any(name in STATE_NAMES for name in own):
        return True
    kernel = getattr(module, "conv_kernel_size", None)
    if isinstance(kernel, int) and kernel > 1 and any(kernel in tensor.shape for tensor in own.values()):
        return True  # a causal convolution's taps held as a parameter (no Conv1d child)
    return any(is_short_convolution(child) for child in module.children())


def find_stateful_layers(model) -> list[tuple[str, object]]:
    """``(name, module)`` of each layer of ``model`` that carries state along the sequence, outermost first.

    >>> from transformers import Qwen3_5TextConfig, Qwen3_5ForCausalLM
    >>> config = Qwen3_5TextConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
    ...     num_key_value_heads=1, head_dim=8, intermediate_size=16, linear_num_key_heads=2,
    ...     linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    ...     layer_types=["linear_attention", "full_attention"])
    >>> [(name, type(m).__name__) for name, m in find_stateful_layers(Qwen3_5ForCausalLM(config))]
    [('model.layers.0.linear_attn', 'Qwen3_5GatedDeltaNet')]
    """
    found: list[tuple[str, object]] = []
    for name, module in model.named_modules():
        if module is model or any(name.startswith(f"{outer}.") for outer, _ in found):
            continue
        if _owns_state(module):
            found.append((name, module))
    return found
