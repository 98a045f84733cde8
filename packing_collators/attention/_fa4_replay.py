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
(milliseconds), plus what FA4 spends on a new variant (a compile, or a load from its disk cache), where running the
whole model per layout costs a forward and backward of every layer each time: seconds on a 1B model.

Both routes record: the eager forward's call (``route="eager"``, through ``flash_attn_varlen_func``) and a compiled
layer's (``route="op"``, FA4's varlen functions inside the custom op ``_fa4_ops``), each replayed through its own
route. The custom op sees the window the layer worked out, not the layer's ``sliding_window``: a window that did not
bind (every sequence within it) looks like none, so such a call is marked ``window_unknown`` and the warm-up replays it
only on a model whose config names no sliding window. The warm-up also runs the whole model where fewer layers called
FA4 than the model has (a hybrid's linear-attention layers run kernels of their own, which the model's passes
warm). Only the forward records (a checkpointed layer's recomputation makes the same calls).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FA4Call", "Recording", "record_fa4_call", "record_fa4_op_call", "recording_fa4_calls"]


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
    route: str = "eager"  # "eager": _fa4.kernel_call; "op": the custom op a compiled layer calls
    window_unknown: bool = False  # "op" without a bound window: the layer may have one that did not bind


@dataclass
class Recording:
    """The distinct FA4 calls one forward made, and how many layers made them."""

    calls: set = field(default_factory=set)
    layers: set = field(default_factory=set)  # ids of the attention modules that called FA4 (the eager route)
    op_calls: int = 0  # calls through the custom op (a compiled layer's; one per layer in a forward)

    @property
    def replayable(self) -> bool:
        """There was a call to replay."""
        return bool(self.calls)

    @property
    def layer_count(self) -> int:
        """The layers that called FA4 in the recorded forward."""
        return len(self.layers) + self.op_calls


_RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("fa4_recording", default=None)


@contextlib.contextmanager
def recording_fa4_calls(recording: Recording | None = None):
    """Record, within the block, every FA4 call the forwards make into ``recording`` (a new one by default), and
    yield it.

    >>> with recording_fa4_calls() as recording:
    ...     pass
    >>> recording.calls, recording.replayable
    (set(), False)
    """
    recording = Recording() if recording is None else recording
    token = _RECORDING.set(recording)
    try:
        yield recording
    finally:
        _RECORDING.reset(token)


def _sink(sink) -> tuple | None:
    return None if sink is None else (tuple(sink.shape), sink.dtype, bool(sink.requires_grad))


def record_fa4_call(module, x, *, scale, sliding_window, softcap: float, sink, deterministic: bool) -> None:
    """Within :func:`recording_fa4_calls`, add the call ``fa4_attention_forward`` makes for ``module`` on ``x``
    (its PackedInputs; ``sliding_window`` the layer's, which the replays bind or not at their own lengths)."""
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
            deterministic=deterministic, sink=_sink(sink),
        )  # fmt: skip
    )


def record_fa4_op_call(q, k, v, *, scale, causal: bool, window: tuple[int, int], softcap: float, sink,
                       deterministic: bool) -> None:  # fmt: skip
    """Within :func:`recording_fa4_calls`, add the call the custom op ``fa4_varlen_fwd`` makes on flat q (T, heads,
    d), k, v (T, kv_heads, d): a compiled layer's. ``window`` is the layer's (left, right), -1 unbounded."""
    recording = _RECORDING.get()
    if recording is None:
        return
    recording.op_calls += 1
    left = window[0]
    recording.calls.add(
        FA4Call(
            dtype=q.dtype, device=q.device, heads=q.shape[1], kv_heads=k.shape[1], head_dim=q.shape[-1],
            head_dim_v=v.shape[-1], scale=scale, causal=causal, sliding_window=left + 1 if left >= 0 else None,
            softcap=float(softcap), deterministic=deterministic, sink=_sink(sink), route="op",
            window_unknown=left < 0,
        )  # fmt: skip
    )
