"""Pack sequences instead of padding them, for fine-tuning with Hugging Face Transformers.

The public API; everything else lives in private modules:

- :func:`pack_lengths` - the packing engine (lengths in, rows of indices out; no torch);
- :func:`pack_sequences`, :func:`concatenate_and_pack` - token lists to padded packed rows;
- :class:`FlatteningCollator` - a minibatch to one flat row with ``cu_seq_lens`` (online flattening);
- :func:`pack_dataset`, :class:`PackStats`, :class:`PrePackedCollator` - offline pre-packing of a
  ``datasets`` dataset or stream, and the collator for its rows;
- :class:`MultipackBatchSampler`, :func:`lengths_from_dataset` - token-budget batches for a DataLoader;
- :class:`PackingTrainer`, :class:`PackingCheckCallback`, :func:`check_packing_support` - Trainer wiring
  and the safety checks;
- :func:`register_varlen_attention` - an attention backend on ``torch.nn.attention.varlen``.

The command line (``packing-collators analyze|pack``) lives in :mod:`packing_collators.cli`.
"""

from ._attention import VARLEN_ATTENTION, register_varlen_attention, varlen_attention_forward
from ._checks import check_packing_support
from ._dataset_packing import pack_dataset
from ._engine import PackingResult, pack_lengths
from ._flattening import FlatteningCollator
from ._lengths import lengths_from_dataset
from ._pack_stats import PackStats
from ._prepacked import PrePackedCollator
from ._rows import concatenate_and_pack, pack_sequences

__all__ = [
    "FlatteningCollator",
    "MultipackBatchSampler",
    "PackStats",
    "PackingCheckCallback",
    "PackingResult",
    "PackingTrainer",
    "PrePackedCollator",
    "VARLEN_ATTENTION",
    "check_packing_support",
    "concatenate_and_pack",
    "lengths_from_dataset",
    "pack_dataset",
    "pack_lengths",
    "pack_sequences",
    "register_varlen_attention",
    "varlen_attention_forward",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # PackingTrainer / PackingCheckCallback subclass transformers' Trainer classes and the sampler
    # subclasses torch's Sampler; importing those takes seconds, so they load on first use and
    # `import packing_collators` (the engine, the collators, the command line) stays fast.
    if name in ("PackingCheckCallback", "PackingTrainer"):
        from . import _trainer

        return getattr(_trainer, name)
    if name == "MultipackBatchSampler":
        from ._sampler import MultipackBatchSampler

        return MultipackBatchSampler
    raise AttributeError(f"module 'packing_collators' has no attribute {name!r}")
