"""The live equivalence probe: measure, on the user's own model, that packing keeps examples apart.

Three short synthetic examples are collated the way training collates them and
run in eval mode (no dropout), under the model's own attention implementation,
dtype and device::

    packed:   [ A A A A A A A | B B B B B | C C C C C C C C C ]     forward 1
    leak:     [ A A A A A A A | b b b b b | C C C C C C C C C ]     forward 2: B's tokens changed
    alone:                                [ C C C C C C C C C ]     forward 3

    (a) logits of A and C under the leak run   exactly equal to the packed run's
    (b) logits of C packed ~= C alone          within the dtype's tolerance

(a) is exact whatever the dtype: the two runs have the same layout, and a kernel that
keeps the examples apart computes A's and C's rows from A's and C's tokens only, so
bf16 noise can neither hide nor fake a leak (A checks attention from earlier to later
examples, as a bidirectional encoder would do; C the usual causal direction). (b)
checks what (a) cannot see, the positions: C sits last, after 12 other tokens, so a
model that numbers positions across the row (or from another start) moves it.

Under a kernel that reads ``cu_seq_lens`` (flash attention, ``packing_varlen``) the
alone run is a segment of the packed row instead of a third forward: a copy of C goes
first, ``[ C | A | B | C ]``, where (a) vouches that nothing reaches it, so it is C
run alone, through the same kernel and collator. A model that fails is refused with
the measured numbers, the first layer whose output moved (forward hooks, on failure
only) and the fix. Cost: two forward passes over about 30 tokens (three over 21 for
other attention), once before training; measured on a GPU in docs/trainer.md ("The live
equivalence probe").
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import attn_implementation
from .._model_unwrap import text_config
from ..attention import attention_kind
from ._probe_experts import tokenwise_experts
from ._probe_images import probe_image
from ._probe_parts import PROBE_LENGTHS, model_inputs, output_logits, probe_dtype, synthetic_tokens, tolerance

__all__ = ["ProbeReport", "probe_packing"]


@dataclass(frozen=True)
class ProbeReport:
    """What the probe measured.

    Attributes:
        model: the model class; implementation: its attention implementation.
        dtype, device: of its parameters (the probe runs where and as the model is).
        lengths: the synthetic examples' lengths.
        max_difference: max |logit| difference of the last example packed vs run alone.
        tolerance: the largest ``max_difference`` accepted (the dtype's, scaled by the logits).
        leak: max |logit| change of the other examples when one example's tokens change (must be 0).
        culprit: the first module whose output moved in the leak run, when the leak test failed.
        culprit_attention: whether that module is a causal attention layer (its attention function then
            lets the examples see each other, prepared or not).
        seconds: wall time of the probe.
        prepared: whether ``enable_packing`` prepared the model (a leak then names a layer kind it does not know).
        experts: the routed experts modules' classes (a mixture-of-experts model), run one token at a time
            during the probe (``_probe_experts.py``: batch composition then cannot round the leak test).
        experts_rounding: max |output| difference of those modules run batched vs one token at a time.
        experts_tolerance: the largest ``experts_rounding`` accepted (the dtype's, scaled by their outputs).
        experts_worst: the experts module of the largest ``experts_rounding``.
    """

    model: str
    implementation: str
    dtype: str
    device: str
    lengths: tuple[int, ...]
    max_difference: float
    tolerance: float
    leak: float
    culprit: str | None
    seconds: float
    prepared: bool = False
    culprit_attention: bool = False
    experts: tuple[str, ...] = ()
    experts_rounding: float = 0.0
    experts_tolerance: float = 0.0
    experts_worst: str | None = None

    @property
    def passed(self) -> bool:
        return self.leak == 0.0 and self.max_difference <= self.tolerance and not self.experts_mix_tokens

    @property
    def experts_mix_tokens(self) -> bool:
        """Whether the routed experts computed a token differently beside others, beyond rounding."""
        return self.experts_rounding > self.experts_tolerance

    def summary(self) -> str:
        """One line for a log.

        >>> ProbeReport("LlamaForCausalLM", "sdpa", "float32", "cpu", (7, 5, 9), 2e-06, 0.0005, 0.0, None, 0.01).summary()
        'packing probe passed: LlamaForCausalLM (sdpa, float32, cpu), examples of 7, 5, 9 tokens: packed vs alone max |logit diff| 2e-06 (tolerance 0.0005), leak 0 (must be 0), 10.0 ms'
        """
        verdict = "passed" if self.passed else "FAILED"
        experts = (
            f"routed experts ({', '.join(self.experts)}) run per token: batched vs per token "
            f"{self.experts_rounding:.3g} (tolerance {self.experts_tolerance:.3g}), "
            if self.experts
            else ""
        )
        return (
            f"packing probe {verdict}: {self.model} ({self.implementation}, {self.dtype}, {self.device}), "
            f"examples of {', '.join(map(str, self.lengths))} tokens: packed vs alone max |logit diff| "
            f"{self.max_difference:.3g} (tolerance {self.tolerance:.3g}), leak {self.leak:.3g} (must be 0), "
            f"{experts}{self.seconds * 1e3:.1f} ms"
        )


def _features(examples: list[np.ndarray], prepacked: bool, image=None, seed: int = 0) -> list[dict]:
    """Examples as a dataset gives them, or (``prepacked``) as pack_dataset rows: A in one row, B+C in another.

    The changed example (B) shares its row with the one after it, so a collator whose rows let
    a row's examples attend to each other (several rows, no cu_seq_lens, flash attention) moves C.
    With an ``image`` (a vision-language model), each example carries the keys a processor gives it.
    """
    if not prepacked:
        extra = (lambda ids: image.features(ids, seed)) if image is not None else (lambda ids: {})
        return [{"input_ids": ids.tolist(), **extra(ids)} for ids in examples]
    rows = [examples[:1], examples[1:]]
    return [
        {
            "input_ids": np.concatenate(row).tolist(),
            "seq_lengths": [len(e) for e in row],
            "position_ids": np.concatenate([np.arange(len(e)) for e in row]).tolist(),
        }
        for row in rows
    ]


def _example_slices(features: list[dict], examples: list[np.ndarray], batch_ids: np.ndarray) -> list[slice]:
    """Where each example's tokens sit in the batch's input_ids, flattened to (rows * width,)."""
    rows, width = batch_ids.shape
    slices, example = [], 0
    for f, feature in enumerate(features):
        start = f * width if rows == len(features) and rows > 1 else sum(len(x["input_ids"]) for x in features[:f])
        for length in feature.get("seq_lengths", [len(feature["input_ids"])]):
            slices.append(slice(start, start + length))
            start += length
            example += 1
    flat = batch_ids.reshape(-1)
    if not all(np.array_equal(flat[s], e) for s, e in zip(slices, examples)):
        raise ValueError(
            "The collator reorders or changes tokens, so the packing probe cannot find each example in its batch. "
            "Pass probe=False to skip the probe (and check the loss against padding yourself)."
        )
    return slices


def _alone_inputs(feature: dict, config, collator, device) -> dict:
    """One example as a padded batch of one would give it: its ``input_ids`` (and image keys; the model
    numbers positions).

    A kernel that reads cu_seq_lens (flash attention, ``packing_varlen``) gets the example flattened
    on its own: the varlen kernel training runs (FA4 compiles no other variant for the probe).
    """
    import torch

    from ..collate import FlatteningCollator

    implementation = attn_implementation(config)
    if attention_kind(implementation) == "cu_seq_lens":
        options = getattr(collator, "options", None)
        start = options.position_ids_start if options is not None else 0
        return model_inputs(FlatteningCollator(position_ids_start=start)([feature]), device)
    inputs = {
        k: torch.as_tensor(np.asarray(v))[None] for k, v in feature.items() if k in ("input_ids", "mm_token_type_ids")
    }
    inputs.update(
        {k: torch.as_tensor(np.asarray(feature[k])) for k in ("pixel_values", "image_grid_thw") if k in feature}
    )
    return {k: v.to(device) for k, v in inputs.items()}


def _logits(model, inputs: dict, tokens: int | None = None) -> np.ndarray:
    """Logits (tokens, vocab), float32, of the first ``tokens`` of a one-row batch (all of them by default):
    a row padded to a compile bucket holds thousands of pad slots the probe does not read."""
    logits = output_logits(model(**inputs))
    if tokens is not None and logits.shape[0] == 1:
        logits = logits[:, :tokens]
    return logits.detach().float().reshape(-1, logits.shape[-1]).cpu().numpy()


def _first_tensor(args: tuple, kwargs: dict):
    for value in (*args, kwargs.get("hidden_states"), *kwargs.values()):
        if hasattr(value, "detach") and value.dim() >= 2:
            return value
    return None


class _Recorder:
    """Forward hooks that keep each module's first input and its output, in the order the modules finish,
    and whether it is a causal attention layer."""

    def __init__(self, model) -> None:
        self.records: list[tuple[str, Any, Any]] = []
        self.handles = [
            m.register_forward_hook(self._hook(name), with_kwargs=True) for name, m in model.named_modules() if name
        ]

    def _hook(self, name: str) -> Callable:
        def record(module, args, kwargs, output):
            output = output[0] if isinstance(output, (tuple, list)) and output else output
            if hasattr(output, "detach") and output.dim() >= 2:
                given = _first_tensor(args, kwargs)
                given = None if given is None else given.detach().float().cpu()
                label = f"{name} ({type(module).__name__})"
                self.records.append((label, given, output.detach().float().cpu(), _is_attention(module)))

        return record

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _is_attention(module) -> bool:
    """A causal attention layer of transformers: ``is_causal`` set and an ``attention_mask`` argument (read
    from its class: ``enable_packing`` may wrap the instance's forward)."""
    forward = getattr(type(module), "forward", None)
    try:
        return bool(getattr(module, "is_causal", False)) and "attention_mask" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def _moved(a, b, rows: np.ndarray, shape: tuple[int, int]) -> bool | None:
    """Whether token-major tensors ``a`` and ``b`` differ at token ``rows`` (None: not token-major)."""
    tokens = shape[0] * shape[1]
    if a is None or b is None or a.shape != b.shape or not (tuple(a.shape[:2]) == shape or a.shape[0] == tokens):
        return None
    return not np.array_equal(a.reshape(tokens, -1)[rows].numpy(), b.reshape(tokens, -1)[rows].numpy())


def _first_moved(
    model, packed: dict, leaked: dict, rows: np.ndarray, shape: tuple[int, int]
) -> tuple[str | None, bool]:
    """The first module whose output moved at token ``rows`` between the two batches while its input did not
    (None if none), and whether it is a causal attention layer."""
    runs = []
    for inputs in (packed, leaked):
        recorder = _Recorder(model)
        try:
            model(**inputs)
        finally:
            recorder.remove()
        runs.append(recorder.records)
    for (name, in_a, out_a, attention), (_, in_b, out_b, _) in zip(*runs):
        if _moved(out_a, out_b, rows, shape) and not _moved(in_a, in_b, rows, shape):
            return name, attention
    return None, False


def _first_parameter(model, lengths: Sequence[int]):
    """The model's first parameter (its device and dtype), or a ValueError for what the probe cannot run."""
    if len(lengths) < 3:
        raise ValueError(
            f"The packing probe needs three or more examples (the middle one is changed); got lengths={list(lengths)}."
        )
    parameter = next(model.parameters(), None)
    if parameter is None:
        raise ValueError(
            f"The packing probe runs the model, and {type(model).__name__} has no parameters; pass probe=False."
        )
    return parameter


def _probe_batches(config, collator, prepacked: bool, lengths: Sequence[int], seed: int, varlen: bool, image):
    """The examples (the last one first too, under a varlen kernel), the changed one's index, the packed
    batch, the batch with that example's tokens changed, each example's slice of the packed row, and
    the last example's features (an ``image`` goes into it, for a vision-language model)."""
    avoid = image.token_ids if image is not None else ()
    examples = synthetic_tokens(config, lengths, seed, avoid)
    if image is not None:
        examples[-1] = image.insert(examples[-1])
    if varlen:
        examples = [examples[-1], *examples]
    changed = list(examples)
    middle = len(examples) // 2
    changed[middle] = synthetic_tokens(config, [len(examples[middle])], seed + 1, avoid)[0]
    features = _features(examples, prepacked, image, seed)
    batch, leaked_batch = collator(features), collator(_features(changed, prepacked, image, seed))
    slices = _example_slices(features, examples, np.asarray(batch["input_ids"]))
    last = _features(examples[-1:], False, image, seed)[0]
    return examples, middle, batch, leaked_batch, slices, last


def probe_packing(
    model,
    collator=None,
    *,
    prepacked: bool | None = None,
    lengths: Sequence[int] = PROBE_LENGTHS,
    seed: int = 0,
    autocast=None,
) -> ProbeReport:
    """Run ``model`` on synthetic examples packed (by ``collator``) and alone, and report the difference.

    Args:
        model: a transformers model with a language-modelling head (its output has ``logits``).
        collator: what collates training batches (default :class:`FlatteningCollator`).
        prepacked: feed the collator pack_dataset rows (``seq_lengths``, ``position_ids``)
            instead of examples; default: whether ``collator`` is a :class:`PrePackedCollator`.
        lengths: the synthetic examples' lengths (three or more; the middle one is changed).
        seed: of the synthetic tokens.
        autocast: a context manager to run the forwards in (e.g. the Trainer's bf16 autocast).

    The model is put in eval mode for the probe and back in its mode after. A compiled model
    (``torch.compile(model)``, as Trainer's ``torch_compile=True`` trains it) is probed compiled:
    what is measured is what training runs.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    ...                      intermediate_size=16, use_cache=False)
    >>> report = probe_packing(LlamaForCausalLM(config))
    >>> report.passed, report.leak, report.max_difference < 1e-4
    (True, 0.0, True)
    """
    import torch

    from ..collate import FlatteningCollator, PrePackedCollator

    parameter = _first_parameter(model, lengths)
    collator = FlatteningCollator() if collator is None else collator
    prepacked = isinstance(collator, PrePackedCollator) if prepacked is None else prepacked
    config = text_config(model)
    started = time.perf_counter()
    # a varlen kernel reads cu_seq_lens, so the first segment of the packed row is a true "alone"
    # run of the last example (the leak test vouches that nothing reaches it): one forward saved
    varlen = attention_kind(attn_implementation(config)) == "cu_seq_lens"
    image = None if prepacked else probe_image(model)  # a vision-language model's probe holds an image
    examples, middle, batch, leaked_batch, slices, last = _probe_batches(
        config, collator, prepacked, lengths, seed, varlen, image
    )
    packed_inputs, leaked_inputs = model_inputs(batch, parameter.device), model_inputs(leaked_batch, parameter.device)
    was_training = model.training
    model.eval()
    eager = getattr(model, "_orig_mod", model)  # hooks on a compiled model's modules would recompile it
    try:
        # varlen kernels run with autograd on, as in training: FA4 then runs the variant training
        # compiles (it returns the softmax statistics backward needs) instead of compiling another
        with (
            torch.enable_grad() if varlen else torch.no_grad(),
            autocast or contextlib.nullcontext(),
            tokenwise_experts(eager) as experts,
        ):
            real = sum(len(e) for e in examples)
            packed, leaked = _logits(model, packed_inputs, real), _logits(model, leaked_inputs, real)
            others = np.concatenate([np.arange(s.start, s.stop) for i, s in enumerate(slices) if i != middle])
            leak = float(np.abs(packed[others] - leaked[others]).max())
            if varlen:
                alone = packed[slices[0]]
            else:
                alone = _logits(model, _alone_inputs(last, config, collator, parameter.device))
            shape = tuple(np.asarray(batch["input_ids"]).shape)
            culprit = _first_moved(eager, packed_inputs, leaked_inputs, others, shape) if leak else (None, False)
    finally:
        model.train(was_training)
    difference = float(np.abs(packed[slices[-1]] - alone).max())
    dtype = probe_dtype(autocast, parameter)
    return ProbeReport(
        model=type(getattr(model, "_orig_mod", model)).__name__,
        implementation=str(attn_implementation(config)),
        dtype=dtype,
        device=str(parameter.device),
        lengths=tuple(int(n) for n in lengths),
        max_difference=difference,
        tolerance=tolerance(dtype, alone),
        leak=leak,
        culprit=culprit[0],
        culprit_attention=culprit[1],
        seconds=time.perf_counter() - started,
        prepared=_prepared(model),
        **experts.report_fields(dtype),
    )


def _prepared(model) -> bool:
    from ..models import packing_layers

    return packing_layers(model) is not None
