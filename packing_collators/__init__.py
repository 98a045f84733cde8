"""Pack sequences instead of padding them, for fine-tuning with Hugging Face Transformers.

The public API (everything in ``__all__``); the package is a folder per concept, each
built only on the ones above it in this map::

    engine/    pack_lengths, PackingResult, PackStats    lengths -> rows of indices (no torch)
    batch/     (packing_collators.batch)                 the packed batch: its keys, its SegmentLayout, and the one
               PackedBatch, SegmentLayout, read_layout   rule that reads its examples back; collate/ writes it, the rest read it
    collate/   FlatteningCollator, PrePackedCollator,    examples or packed rows -> batches
               pack_sequences, concatenate_and_pack,     (length_buckets: a few row lengths
               length_buckets                            for torch.compile)
    offline/   pack_dataset                              a datasets Dataset/stream -> packed rows
    chat/      tokenize_chat, tokenize_chat_example,     conversations -> input_ids and
               ChatStats                                 assistant-only labels
    sampler/   MultipackBatchSampler, lengths_from_dataset,  token-budget micro-batches per rank,
               fit_attention_weight, CostFit             balanced by a cost model fitted from timings
    attention/ register_varlen_attention,                varlen attention backends (torch's kernel
               register_fa4_attention, choose_attention, as packing_varlen, FA4's as packing_fa4)
               warm_up_attention                         and the fastest packed-correct one here
    loss/      enable_chunked_loss                       the loss from the last hidden states a chunk of
                                                         tokens at a time: never the T x V logits
    models/    enable_packing, compile_layers            hybrids (Gated DeltaNet, Mamba, short convs) and
                                                         VLMs keep packed examples apart: stateful layers
                                                         per example or on varlen kernels, each example's
                                                         multimodal positions; the decoder layers compiled
                                                         in place (one graph for all)
    fused/     fuse_rms_norms, fuse_swiglu, fuse_rope    eager layers on fused kernels: the RMSNorms on
                                                         torch's, SwiGLU's product and the rotary
                                                         embedding on Triton kernels
    checks/    check_packing_support, probe_packing,     refuse, before training, a model, batch or
               ProbeReport                               collator that would mix examples; the probe
    parallel/  SequenceShardCollator, shard_flat_batch,  sequence parallelism (Ulysses) for packed rows:
               enable_ulysses_attention,                 a rank's shard, the all-to-all attention,
               sequence_parallel_mesh,                   the dp x sp mesh, the probe through it
               probe_sequence_parallel                   (PackingTrainer(sequence_parallel_size=n))
    preference/ PackingDPOTrainer, PreferenceCollator    preference pairs (DPO) in packed rows, exact against TRL
    rl/        PackingGRPOTrainer, PackingRLOOTrainer    GRPO / RLOO scoring forwards on packed rows, each prompt
                                                         once for its group (share_prompt), exact against TRL
    trainer/   PackingTrainer, PackingCheckCallback,     Trainer wiring, packing metrics in the logs,
               PackingMetricsCallback,                   a token budget from GPU memory (measured,
               (budget/: measure_token_budget,           or a given one checked), torch.compile
               check_token_budget)
    cli/       packing-collators analyze|pack            the command line
    _validation.py    the argument checks every folder shares
    _progress.py      when long work shows a progress bar (one rule, following datasets/transformers)
    _model_unwrap.py  the transformers model inside its wrappers, and its text config
    _lazy.py          names a facade loads on first use (this one, trainer/'s, sampler/'s)
    _kernel_check.py  a Triton kernel trusted on a device once it ran there with torch's numbers (loss/, fused/)

``PackingTrainer``, ``PackingCheckCallback``, ``PackingMetricsCallback``, ``MultipackBatchSampler``,
``enable_packing`` and ``enable_chunked_loss`` load on first use (they import transformers' Trainer or torch), so
``import packing_collators`` stays fast. What a user needs leaves here; the rest is its folder's
(``CompileReport`` and ``warm_up_compiled`` in ``packing_collators.trainer``, the backends' names
``FA4_ATTENTION`` and ``VARLEN_ATTENTION`` in ``packing_collators.attention``: asked for here, each
says so).
"""

from ._lazy import lazy_names
from ._version import __version__  # noqa: F401  (the version, not in __all__)
from .attention import (
    choose_attention,
    register_fa4_attention,
    register_varlen_attention,
    varlen_attention_forward,
    warm_up_attention,
)
from .budget import TokenBudget, check_token_budget, measure_token_budget
from .chat import ChatStats, tokenize_chat, tokenize_chat_example
from .checks import ProbeReport, check_packing_support, probe_packing
from .collate import FlatteningCollator, PrePackedCollator, concatenate_and_pack, length_buckets, pack_sequences
from .engine import PackingResult, PackStats, pack_lengths
from .offline import pack_dataset
from .parallel import (
    SequenceShardCollator,
    enable_ulysses_attention,
    probe_sequence_parallel,
    sequence_parallel_mesh,
    shard_flat_batch,
)
from .sampler import CostFit, fit_attention_weight, lengths_from_dataset
from .trainer import count_sequences, sequence_loss_weights, sequence_mean_loss

__all__ = [
    "ChatStats",
    "CostFit",
    "FlatteningCollator",
    "MultipackBatchSampler",
    "PackStats",
    "PackingCheckCallback",
    "PackingDPOTrainer",
    "PackingGRPOTrainer",
    "PackingMetricsCallback",
    "PackingRLOOTrainer",
    "PackingResult",
    "PackingTrainer",
    "PrePackedCollator",
    "PreferenceCollator",
    "ProbeReport",
    "SequenceShardCollator",
    "TokenBudget",
    "check_packing_support",
    "check_token_budget",
    "choose_attention",
    "compile_layers",
    "concatenate_and_pack",
    "count_sequences",
    "enable_chunked_loss",
    "enable_packing",
    "enable_ulysses_attention",
    "fit_attention_weight",
    "fuse_rms_norms",
    "fuse_rope",
    "fuse_swiglu",
    "length_buckets",
    "lengths_from_dataset",
    "measure_token_budget",
    "pack_dataset",
    "pack_lengths",
    "pack_sequences",
    "probe_packing",
    "probe_sequence_parallel",
    "register_fa4_attention",
    "register_varlen_attention",
    "sequence_loss_weights",
    "sequence_mean_loss",
    "sequence_parallel_mesh",
    "shard_flat_batch",
    "tokenize_chat",
    "tokenize_chat_example",
    "varlen_attention_forward",
    "warm_up_attention",
]


# PackingTrainer and the callbacks subclass transformers' Trainer classes, the sampler torch's Sampler, and
# models/, loss/ and preference/ import torch (and TRL, for the DPO trainer): they load on first use, so `import
# packing_collators` (the engine, the collators, the command line) stays fast. Names that moved under their
# folder say where they are now.
__getattr__ = lazy_names(
    __name__,
    {
        "PackingCheckCallback": ".trainer",
        "PackingMetricsCallback": ".trainer",
        "PackingTrainer": ".trainer",
        "MultipackBatchSampler": ".sampler",
        "enable_packing": ".models",
        "compile_layers": ".models",
        "fuse_rms_norms": ".fused",
        "fuse_rope": ".fused",
        "fuse_swiglu": ".fused",
        "enable_chunked_loss": ".loss",
        "PackingDPOTrainer": ".preference",
        "PreferenceCollator": ".preference",
        "PackingGRPOTrainer": ".rl",
        "PackingRLOOTrainer": ".rl",
    },
    moved={
        "CompileReport": "packing_collators.trainer",
        "warm_up_compiled": "packing_collators.trainer",
        "FA4_ATTENTION": "packing_collators.attention",
        "VARLEN_ATTENTION": "packing_collators.attention",
    },
)
