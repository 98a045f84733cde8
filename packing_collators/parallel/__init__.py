"""Sequence parallelism for packed batches: examples longer than one GPU holds, trained exactly.

One packed micro-batch per group of ``n`` ranks; each rank holds ``1/n`` of the row::

    sampler (dp_size replicas)  -> the same example indices on every rank of a group
    collator                    -> FlatteningCollator: one flat row, global cu_seq_lens
    SequenceShardCollator       -> shift_labels over the whole row, pad to a multiple of n, keep T/n tokens
    model, Ulysses attention    -> all-to-all to head shards, kernel over the whole row, all-to-all back
    loss                        -> sum over this shard's targets / targets of the whole global batch
    gradients                   -> reduced over every rank (DDP or FSDP2 over the world)

_mesh.py     sequence_parallel_mesh: DeviceMesh ("dp", "sp"), which ranks share a micro-batch
_shard.py    shard_flat_batch / SequenceShardCollator: one rank's contiguous shard, targets fixed first
_ulysses.py  enable_ulysses_attention: the all-to-all around the model's own kernel; the head checks
_probe.py    probe_sequence_parallel: the live leak / exactness probe through the sharded path

``PackingTrainer(sequence_parallel_size=n)`` wires all of it; a custom loop uses the pieces
(see docs/sequence_parallel.md).
"""

from ._mesh import SequenceParallelMesh, check_sequence_parallel_size, sequence_parallel_mesh
from ._probe import probe_sequence_parallel
from ._shard import SequenceShardCollator, shard_flat_batch
from ._ulysses import check_sequence_parallel_model, enable_ulysses_attention, inner_attention

__all__ = [
    "SequenceParallelMesh",
    "SequenceShardCollator",
    "check_sequence_parallel_model",
    "check_sequence_parallel_size",
    "enable_ulysses_attention",
    "inner_attention",
    "probe_sequence_parallel",
    "sequence_parallel_mesh",
    "shard_flat_batch",
]
