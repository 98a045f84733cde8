"""``decoding_attention``: generation under the transformers implementation of the same kernel.

This library's ``packing_fa4`` and ``packing_varlen`` read packed rows only: a padded batch or decoding with a cache
is refused. A trainer that generates between packed steps (GRPO, RLOO) runs ``generate`` inside this context: the
model decodes on ``flash_attention_4`` (FA4's kernel through transformers' layer, which pads and caches) or on
``sdpa`` (torch's varlen kernel has no decoding path), and is back on its packed attention afterwards. Any other
implementation is left as it is.
"""

from __future__ import annotations

import contextlib
import logging

from ._fa4 import FA4_ATTENTION
from ._varlen import VARLEN_ATTENTION

__all__ = ["DECODING_ATTENTION", "decoding_attention"]

DECODING_ATTENTION = {FA4_ATTENTION: "flash_attention_4", VARLEN_ATTENTION: "sdpa"}
"""Packed-only implementation -> the one ``generate`` runs under (the same kernel where transformers has it)."""

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def decoding_attention(model):
    """Inside: ``model`` (unwrapped) on the implementation that decodes; after: on the one it had.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from packing_collators._compat import attn_implementation
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
    ...                                      num_attention_heads=2, intermediate_size=8))
    >>> with decoding_attention(model):  # sdpa decodes as it is
    ...     attn_implementation(model.config)
    'sdpa'
    """
    from .._compat import attn_implementation
    from .._model_unwrap import text_config, unwrap_model

    model = unwrap_model(model)
    packed = attn_implementation(text_config(model))
    if packed not in DECODING_ATTENTION:
        yield
        return
    decoding = DECODING_ATTENTION[packed]
    try:
        model.set_attn_implementation(decoding)
    except (ImportError, ValueError) as error:  # transformers cannot run it here: sdpa decodes anywhere
        logger.info("decoding under sdpa, not %s: %s", decoding, str(error).splitlines()[0][:200])
        model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(packed)
