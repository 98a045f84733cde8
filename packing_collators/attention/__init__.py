"""Attention backends for packed batches: how each keeps examples apart, and the fastest one here.

_kind.py     attention_kind: how an implementation keeps examples apart ("cu_seq_lens", "position_ids");
             check_backend_limits: what this library's backends lack
_inputs.py   what both backends read from the batch: flat (1, T) tensors, causality, window, autocast
_varlen.py   packing_varlen, a backend on torch.nn.attention.varlen (PyTorch's Flash kernel)
_fa4.py      packing_fa4, FlashAttention-4's varlen kernel called straight from the batch
_fa4_ops.py  FA4's kernel as torch.library custom ops (fake + autograd): traced by torch.compile
_decoding.py decoding_attention: generate under the transformers implementation of the same kernel
_choice.py   choose_attention: the fastest packed-correct attention on this machine
_warm_up.py  warm_up_attention: FA4's kernel variants compiled before training, the model run once
_fa4_replay.py  FA4's calls recorded in one forward, replayed alone on other layouts (the warm-up's)

Imports nothing of the package's other folders but ``collate`` (the warm-up's batches); the checks
(``checks/``), sequence parallelism (``parallel/``) and the Trainer (``trainer/``) build on it.
"""

from ._choice import AUTO_ATTENTION, choose_attention, packed_attention_candidates
from ._decoding import DECODING_ATTENTION, decoding_attention
from ._fa4 import FA4_ATTENTION, fa4_attention_forward, register_fa4_attention
from ._kind import FLASH_IMPLEMENTATIONS, attention_kind, check_backend_limits, own_backend
from ._varlen import VARLEN_ATTENTION, register_varlen_attention, varlen_attention_forward
from ._warm_up import FA4_MANY, run_warm_up, warm_up_attention, warm_up_layouts

__all__ = [
    "AUTO_ATTENTION",
    "DECODING_ATTENTION",
    "FA4_ATTENTION",
    "FA4_MANY",
    "FLASH_IMPLEMENTATIONS",
    "VARLEN_ATTENTION",
    "attention_kind",
    "check_backend_limits",
    "choose_attention",
    "decoding_attention",
    "fa4_attention_forward",
    "own_backend",
    "packed_attention_candidates",
    "register_fa4_attention",
    "register_varlen_attention",
    "run_warm_up",
    "varlen_attention_forward",
    "warm_up_attention",
    "warm_up_layouts",
]
