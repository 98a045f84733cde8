"""FA4's kernel calls, recorded in one forward to be replayed alone on other batch layouts (``_warm_up.replay``).

FlashAttention-4 compiles a kernel variant per configuration, and the configuration is what the call passes (dtype,
heads, head dims, causal, window, softcap, attention sinks, determinism) and the batch's layout (its longest
sequence, how many sequences). One forward and backward of the model, recorded, gives every distinct call its
layers make; each further layout then needs only those calls, on random q, k, v of that layout::

    model forward + backward on the first layout, recording  ->  {FA4Call(bf16, 16 heads, 8 kv heads, d 128, causal)}
    every further layout: for each FA4Call, q, k, v ~ N(0, 1) laid out as it says, FA4 forward and backward

A replay (``_warm_up.replay``) makes the forward's own call (``_fa4.kernel_call``), so it meets the variants the model would; the window is
worked out again for the layout (a sliding window binds only where a sequence is longer than it).
Cost: one model pass, then per layout and distinct call one attention forward and backward on a few thousand tokens
(milliseconds), plus what FA4 spends on a new variant (a compile, or a load from its disk cache). Running the whole
model per layout, as the warm-up did, cost a forward and backward of every layer each time: seconds on a 1B model.

Only the eager path records. A compiled layer calls FA4 through the custom op (``_fa4_ops``), whose calls are counted
as ``traced``: a recording that saw one is not replayable, and the warm-up runs the whole model instead. The warm-up
also runs the whole model where fewer layers called FA4 than the model has (a hybrid's linear-attention layers run
kernels of their own, which the model's passes warm as they did before).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FA4Call", "Recording", "note_traced_call", "record_fa4_call", "recording_fa4_calls"]


@dataclass(frozen=True)
class FA4Call:
    """What decides an FA4 call's kernel variant, but for the layout: a layer's call as the warm-up replays it."""

    dtype: Any
    device: Any
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int
    scale: float | None
    causal: bool
    sliding_window: int | None
    softcap: float
    deterministic: bool
    sink: tuple | None  # (shape, dtype, requires_grad) of the attention sinks, None without


@dataclass
class Recording:
    """The distinct calls one forward made, and how many went through the custom op instead (not recorded)."""

    calls: set = field(default_factory=set)
    traced: int = 0
    layers: set = field(default_factory=set)  # ids of the attention modules that called FA4

    @property
    def replayable(self) -> bool:
        """Every FA4 call of the forward was recorded (none traced), and there was one."""
        return bool(self.calls) and not self.traced


_RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("fa4_recording", default=None)


@contextlib.contextmanager
def recording_fa4_calls():
    """Record, within the block, every eager FA4 call the forwards make (yields the :class:`Recording`).

    >>> with recording_fa4_calls() as recording:
    ...     pass
    >>> recording.calls, recording.replayable
    (set(), False)
    """
    recording = Recording()
    token = _RECORDING.set(recording)
    try:
        yield recording
    finally:
        _RECORDING.reset(token)


def record_fa4_call(module, x, *, scale, sliding_window, softcap: float, sink, deterministic: bool) -> None:
    """Within :func:`recording_fa4_calls`, add the call ``fa4_attention_forward`` makes for ``module`` on ``x``
    (its PackedInputs)."""
    recording = _RECORDING.get()
    if recording is None:
        return
    recording.layers.add(id(module))
    _, heads, _, head_dim = x.query.shape
    recording.calls.add(
        FA4Call(
            dtype=x.query.dtype, device=x.query.device, heads=heads, kv_heads=x.key.shape[1], head_dim=head_dim,
            head_dim_v=x.value.shape[-1], scale=scale, causal=x.causal,
            sliding_window=None if sliding_window is None else int(sliding_window), softcap=float(softcap),
            deterministic=deterministic,
            sink=None if sink is None else (tuple(sink.shape), sink.dtype, bool(sink.requires_grad)),
        )  # fmt: skip
    )


def note_traced_call() -> None:
    """Within :func:`recording_fa4_calls`, count a call the custom op made (a compiled layer's): not replayable."""
    recording = _RECORDING.get()
    if recording is not None:
        recording.traced += 1
