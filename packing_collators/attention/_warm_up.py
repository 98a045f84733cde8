"""FlashAttention-4's kernel variants compiled before training, for the batch layouts training reaches.

FA4 compiles a kernel variant per configuration (seconds each, or a load from its disk cache), and the configuration
follows the batch: its longest sequence (FA4 packs grouped-query heads for short sequences; its backward has a
variant for queries or keys that fit one tile) and its number of sequences (more than 256 get another scheduler).
Left alone, a run compiles whenever a batch of a new kind arrives, in the middle of training. So before the first step:

    the layouts    both ends of every octave of longest sequences from 16 to the longest a batch holds
                   (warm_up_lengths), each as ``tokens`` tokens of such sequences and, where a batch can hold
                   over 256 sequences, as one among 300 short ones; where the sampler's plan is known (``reached``),
                   only the octaves its batches reach
    the first      through the whole model, forward and backward, recording the FA4 calls its layers make
    the others     those calls alone, on random q, k, v of each layout (:func:`replay`); through the whole model
                   again where the recording does not stand for the model (:func:`replays_the_model`: another
                   attention, a hybrid, a compiled call whose window is unknown on a windowed model)

Cost: one forward and backward of the model on a few thousand tokens, then milliseconds per layout, plus FA4's own
compile (or disk-cache load) of each new variant; where the model runs every layout, a forward and backward of every
layer per layout (20 to 40 layouts).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from .._model_unwrap import text_config, unwrap_model
from ._fa4 import kernel_call, op_call
from ._fa4_replay import FA4Call, Recording, recording_fa4_calls
from ._inputs import window

__all__ = [
    "FA4_MANY",
    "MANY_SEQUENCES",
    "replay",
    "run_warm_up",
    "warm_up_attention",
    "warm_up_layouts",
    "warm_up_lengths",
]

logger = logging.getLogger(__name__)

FA4_MANY = 256
"""FA4 schedules a batch of more than this many sequences with a batch-lookup aid, a kernel variant of its own
(flash_attn.cute's ``BIN_BATCH_SEARCH_THRESH``)."""

MANY_SEQUENCES = 300
"""Sequences in a warm-up batch that must count as "many" (more than ``FA4_MANY``)."""


def _octave_top(n: int, max_length: int) -> int:
    """The longest length whose variants ``n`` stands for: its octave's top (at least 16, at most ``max_length``)."""
    return min(max_length, max(16, 1 << (n - 1).bit_length()))


def warm_up_lengths(max_length: int, shortest: int = 1) -> list[int]:
    """The longest-example lengths a warm-up runs: both ends of every octave from 16 up to ``max_length``,
    but for the octaves below ``shortest`` (the shortest example: no batch's longest sequence is shorter).

    A JIT kernel's variant follows thresholds on the batch's longest example (FA4's backward
    specializes on whether the queries or keys fit one tile of 64 or 128; its forward on whether
    the grouped-query-packed queries fit one block): lengths ``2**j`` and ``2**j + 1`` fall on both
    sides of every power-of-two threshold, and each octave holds both ends, so a threshold inside
    one (a tile over 3 query heads) also has a length on each side.

    >>> warm_up_lengths(300)
    [16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 300]
    >>> warm_up_lengths(300, shortest=100)  # (64, 128] holds 100: its two ends, and the octaves above
    [65, 128, 129, 256, 257, 300]
    >>> warm_up_lengths(10)
    [10]
    """
    lengths, power = [min(16, max_length)], 16
    while power < max_length:
        lengths += [n for n in (power + 1, 2 * power) if n <= max_length]
        power *= 2
    floor = min(shortest, max_length)
    return [n for n in sorted(set(lengths) | {max_length}) if _octave_top(n, max_length) >= floor]


def warm_up_layouts(
    max_length: int,
    *,
    tokens: int = 4096,
    shortest: int = 1,
    most_sequences: int | None = None,
    reached: Iterable[tuple[int, int]] | None = None,
) -> list[list[int]]:
    """The warm-up's batches, each as its sequences' lengths: per length of :func:`warm_up_lengths`, ``tokens``
    tokens of sequences of that length and, where a batch can hold more than ``FA4_MANY`` sequences
    (``most_sequences``, None: unknown), one of that length among ``MANY_SEQUENCES`` 8-token ones.

    ``reached``: the (longest sequence, sequences) of every batch training runs, where known (the sampler's plan):
    only the octaves some batch's longest sequence falls in, and the many-sequence batch only in an octave where a
    batch of over ``FA4_MANY`` sequences has its longest.

    >>> [max(b) for b in warm_up_layouts(300, tokens=600, most_sequences=100)]
    [16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 300]
    >>> [(max(b), len(b)) for b in warm_up_layouts(300, tokens=600, reached=[(290, 2), (120, 3), (100, 280)])]
    [(65, 9), (65, 301), (128, 4), (128, 301), (257, 2), (300, 2)]
    """
    many = most_sequences is None or most_sequences > FA4_MANY
    if reached is not None:
        reached = list(reached)
        tops = {_octave_top(longest, max_length) for longest, _ in reached}
        many_tops = {_octave_top(longest, max_length) for longest, count in reached if count > FA4_MANY}
    layouts = []
    for length in warm_up_lengths(max_length, shortest):
        top = _octave_top(length, max_length)
        if reached is not None and top not in tops:
            continue
        layouts.append([length] * max(1, min(tokens, max_length * 4, FA4_MANY * length) // length))
        if many and (reached is None or top in many_tops):
            layouts.append([length] + [min(8, length)] * MANY_SEQUENCES)
    return layouts


def _backward_through_layers(model, batch: dict, autocast=None, forward_context=None) -> None:
    """A forward (under ``autocast``, and ``forward_context`` where given) and backward through every layer without
    the ``T x V`` logits: only the last position's logits where the model takes ``logits_to_keep`` (every layer's
    backward kernels still run over all ``T`` tokens), else the model's own loss."""
    import contextlib
    import inspect

    with autocast or contextlib.nullcontext(), forward_context or contextlib.nullcontext():
        if "logits_to_keep" in inspect.signature(type(unwrap_model(model)).forward).parameters:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            loss = model(**inputs, logits_to_keep=1).logits.float().sum()
        else:
            loss = model(**batch).loss
    loss.backward()


def replay(call: FA4Call, lengths: list[int], generator=None) -> None:
    """``call`` alone, forward and backward, on random q, k, v of sequences of ``lengths`` tokens laid end to end.

    >>> import torch
    >>> from packing_collators.attention import _fa4
    >>> from packing_collators.attention._fa4_replay import FA4Call
    >>> seen = []
    >>> def kernel(q, k, v, **kwargs):  # FA4's signature; here it notes the layout and returns q
    ...     cu, window = kwargs["cu_seqlens_q"].tolist(), kwargs["window_size"]
    ...     seen.append((tuple(q.shape), cu, kwargs["max_seqlen_q"], window))
    ...     return q * 1.0, None
    >>> _kernel, _fa4._kernel = _fa4._kernel, lambda query: kernel
    >>> call = FA4Call(torch.bfloat16, torch.device("cpu"), 4, 2, 8, 8, None, True, 16, 0.0, False, None)
    >>> replay(call, [20, 3]); replay(call, [5, 3])
    >>> _fa4._kernel = _kernel
    >>> seen  # a window only where a sequence is longer than it
    [((23, 4, 8), [0, 20, 23], 20, (15, 0)), ((8, 4, 8), [0, 5, 8], 5, (None, None))]
    """
    import torch

    tokens, longest = sum(lengths), max(lengths)

    def random(heads: int, dim: int):
        values = torch.randn(tokens, heads, dim, generator=generator, dtype=torch.float32)
        return values.to(device=call.device, dtype=call.dtype).requires_grad_(True)

    q, k = random(call.heads, call.head_dim), random(call.kv_heads, call.head_dim)
    v = random(call.kv_heads, call.head_dim_v)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=call.device)
    sink = None
    if call.sink is not None:
        shape, dtype, grad = call.sink
        sink = torch.zeros(shape, dtype=dtype, device=call.device, requires_grad=grad)
    call_fa4 = op_call if call.route == "op" else kernel_call  # a compiled layer's call goes through the custom op
    out = call_fa4(q, k, v, cu, cu, longest, longest, scale=call.scale, causal=call.causal,
                   window=window(call.causal, call.sliding_window, longest), sink=sink, softcap=call.softcap,
                   deterministic=call.deterministic)  # fmt: skip
    out.backward(torch.randn(out.shape, generator=generator, dtype=torch.float32).to(out))


def replays_the_model(recording: Recording | None, model) -> bool:
    """``recording`` stands for the whole of ``model``'s forward: at least as many layers called FA4 as the model has
    decoder layers (not a hybrid, whose other layers' kernels the model's own passes warm), and no compiled layer's
    call whose window is unknown on a model whose config names a sliding window."""
    config = text_config(model)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    if recording is None or not recording.replayable or recording.layer_count < layers:
        return False
    return not (getattr(config, "sliding_window", None) and any(call.window_unknown for call in recording.calls))


def run_warm_up(model, layouts: list[list[int]], *, autocast=None, recording: Recording | None = None) -> Recording:
    """Run ``layouts`` (batches as sequence lengths): the first through ``model`` (forward under ``autocast``, then
    backward), recording its FA4 calls, the others as replays of them; every one through the model where the
    recording does not stand for the model (:func:`replays_the_model`). A ``recording`` that does, from an earlier
    warm-up of the same model, skips the model pass. Gradients are cleared after; no weight changes. Returns the
    recording."""
    import torch

    from ..collate import FlatteningCollator

    parameter = next(model.parameters())
    vocab = int(text_config(model).vocab_size)
    generator = torch.Generator().manual_seed(0)

    def through_model(lengths: list[int], forward_context=None) -> None:
        examples = [{"input_ids": torch.randint(0, vocab, (n,), generator=generator)} for n in lengths]
        batch = {
            k: v.to(parameter.device) if hasattr(v, "to") else v for k, v in FlatteningCollator()(examples).items()
        }
        _backward_through_layers(model, batch, autocast, forward_context=forward_context)

    rest = list(layouts)
    with torch.enable_grad():
        if rest and not replays_the_model(recording, model):
            recording = Recording()  # the forward's calls (a recomputation in the backward makes the same)
            through_model(rest.pop(0), forward_context=recording_fa4_calls(recording))
        replaying = replays_the_model(recording, model)
        for lengths in rest:
            if replaying:
                for call in recording.calls:
                    replay(call, lengths, generator)
            else:
                through_model(lengths)
    model.zero_grad(set_to_none=True)
    if layouts:
        logger.info("FA4 warm-up: %d batch layouts, %s", len(layouts),
                    f"{len(layouts) - 1} as {len(recording.calls)} recorded attention call(s) alone"
                    if replaying else "every one through the model")  # fmt: skip
    return recording if recording is not None else Recording()


def warm_up_attention(
    model,
    *,
    max_length: int,
    tokens: int = 4096,
    autocast=None,
    shortest: int = 1,
    most_sequences: int | None = None,
    reached: Iterable[tuple[int, int]] | None = None,
) -> float:
    """Compile the attention kernel's variants for flat batches whose longest sequence runs from 16 (or
    ``shortest``, the shortest example) to ``max_length`` tokens, before training: :func:`warm_up_layouts`'s batches,
    run by :func:`run_warm_up` (the model once, then FA4's recorded calls alone). Returns the seconds it took.

    The model's backward starts from the last position's logits (not a loss over ``T x V`` logits: a 16,384-token
    row at a 152k vocabulary would hold 25 GB more than training does). Its forward runs under ``autocast`` (the
    Trainer's: float32 weights with ``bf16=True`` give the kernel the half activations training does; a kernel
    refuses float32). What training can reach, where the caller knows it, leaves out kernels no batch would select:
    ``shortest`` (the octaves below it), ``most_sequences`` (at most ``FA4_MANY``: no many-sequence batches),
    ``reached`` (each batch's longest sequence and sequences: only their octaves; see :func:`warm_up_layouts`).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
    ...                                      num_attention_heads=2, intermediate_size=8, use_cache=False))
    >>> warm_up_attention(model, max_length=64, tokens=128) >= 0
    True
    """
    import time

    started = time.perf_counter()
    layouts = warm_up_layouts(max_length, tokens=tokens, shortest=shortest, most_sequences=most_sequences,
                              reached=reached)  # fmt: skip
    run_warm_up(model, layouts, autocast=autocast)
    return time.perf_counter() - started
