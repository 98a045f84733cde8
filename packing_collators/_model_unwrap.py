"""The transformers model inside its wrappers (DDP, FSDP version 1, PEFT), and its text config.

    DDP(PeftModel(LlamaForCausalLM))  --unwrap_model-->  LlamaForCausalLM   (class, config, signature)
                                      --probe_module-->  LlamaForCausalLM   (what the probe runs; FSDP1 kept)
    model                             --text_config-->   the language model's config (a vision-language
                                                         model's text part; the config itself otherwise)

The one home of these three, for every folder that reads a model (attention, checks, parallel,
trainer). Cost: a few attribute reads.
"""

from __future__ import annotations

__all__ = ["probe_module", "text_config", "unwrap_model"]


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
    """The config of ``model``'s language model: ``config.get_text_config()`` where the config has one.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    >>> text_config(LlamaForCausalLM(config)).vocab_size
    16
    """
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"Packing needs a transformers model (with .config), got {type(model).__name__}.")
    return config.get_text_config() if hasattr(config, "get_text_config") else config
