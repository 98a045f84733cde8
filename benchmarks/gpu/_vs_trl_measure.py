"""What vs_trl.py measures in every setting, the same way: per optimizer step, its tokens, its seconds, its loss.

    Trainer loop            StepRecorder
    on_step_begin   ->      synchronize; start the clock (first step: peak memory so far kept, then reset)
    training_step   ->      the micro-batch's real tokens, examples and a checksum of its token ids; its loss
    on_step_end     ->      synchronize; stop the clock

The step's seconds hold its forward, backward and optimizer step and any host work inside them (TRL's metrics,
FA4's kernel compiles at a new shape); the batch's loading and the Trainer's logging fall between steps, and
only the whole-run rate counts them. Tensors read in a step (token counts, losses) are kept as tensors and read
after training, so recording adds no host sync beyond the two at the step's boundaries.

``step_statistics`` turns the steps into the figures a row reports (the median step, the steady state without
stalls, the whole run); ``fa4_int_lengths`` installs the FA4 wrapper every CUDA setting runs through.
``first_step_s``: from the process's start (the interpreter's, before torch is imported) to the end of the first
optimizer step: what a user who times a short run waits for (imports, the model, the trainer's checks and
dry runs, compiles, the step).
"""

from __future__ import annotations

import importlib.metadata
import os
import statistics
import time

import torch

STALL_FACTOR = 2.0  # a step slower than this many times the median step is a stall (a compile, an allocator retry)
_GIB = 1 << 30


def batch_numbers(inputs: dict, padding_id: int | None = None) -> dict:
    """A collated batch's real tokens, examples and token-id checksum (tensors where reading them would sync);
    ``padding_id``: the collator pads rows to buckets with a segment of these tokens, which is not counted."""
    from packing_collators.batch import padding_tail

    ids = inputs["input_ids"]
    mask = inputs.get("attention_mask")
    if "cu_seq_lens_q" in inputs:
        examples = inputs["cu_seq_lens_q"].numel() - 1
    elif "position_ids" in inputs:
        examples = (inputs["position_ids"] == 0).sum()
    else:
        examples = ids.shape[0]
    tokens = mask.sum() if mask is not None else ids.numel()
    if mask is None and padding_id is not None:
        padding = padding_tail(inputs, padding_id)
        tokens, examples = tokens - padding, examples - (padding > 0).long()
    weights = torch.arange(ids.numel(), device=ids.device).view(ids.shape) % 1009 + 1  # order matters
    return {"tokens": tokens, "examples": examples, "checksum": (ids.long() * weights).sum()}


def bucket_padding_id(trainer) -> int | None:
    """The token of the padding segment the trainer's training collator (PackingTrainer compiled: its compile plan's)
    appends to reach a bucket, or None."""
    from packing_collators.collate._bucketed import bucket_padding_id as padding_of

    return padding_of(getattr(getattr(trainer, "_compile", None), "collator", None) or trainer.data_collator)


def _number(value) -> float:
    return float(value.item()) if torch.is_tensor(value) else float(value)


class StepRecorder:
    """Records every optimizer step of one trainer (see the module docstring); ``attach`` before ``train()``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.raw: list[dict] = []  # per step: seconds and its micro-batches' numbers (tensors until summary)
        self._micro: list[dict] = []
        self._began = self.first_begin = self.last_end = self.first_step_s = None
        self.peak_before_steps = self.folded = 0  # bytes: before the first step; peaks that resets would lose

    def attach(self, trainer) -> None:
        inner = trainer.training_step

        def training_step(model, inputs, *args, **kwargs):
            numbers = batch_numbers(inputs, bucket_padding_id(trainer))
            loss = inner(model, inputs, *args, **kwargs)
            self._micro.append({**numbers, "loss": loss.detach()})
            return loss

        trainer.training_step = training_step  # the Trainer calls self.training_step: this instance's wins
        trainer.add_callback(self._callback())

    def watch_memory(self) -> None:
        """Start the whole run's peak here, and keep it across resets: the library's budget dry runs (and
        trl_auto_cap's) reset the peak counter, so each reset first folds the peak so far into ``folded``."""
        if not self.cuda:
            return
        torch.cuda.reset_peak_memory_stats(self.device)
        reset = torch.cuda.reset_peak_memory_stats

        def folding_reset(device=None):
            self.folded = max(self.folded, torch.cuda.max_memory_allocated(device))
            reset(device)

        torch.cuda.reset_peak_memory_stats = folding_reset

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def begin(self) -> None:
        self._sync()
        if self.first_begin is None and self.cuda:  # construction, budget measurement, probe: before the steps
            torch.cuda.reset_peak_memory_stats(self.device)  # folds the peak so far in
            self.peak_before_steps, self.folded = self.folded, 0
        self._micro, self._began = [], time.perf_counter()
        self.first_begin = self.first_begin or self._began

    def end(self) -> None:
        self._sync()
        self.last_end = time.perf_counter()
        self.raw.append({"seconds": self.last_end - self._began, "micro": self._micro})
        if self.first_step_s is None:
            self.first_step_s = seconds_since_process_start()
        # a line per step as it ends (the log shows how far a run that is cut off got; no sync beyond the clock's)
        print(f"vs_trl: step {len(self.raw)} took {self.raw[-1]['seconds']:.2f} s", flush=True)

    def _callback(self):
        from transformers import TrainerCallback

        recorder = self

        class StepClock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                recorder.begin()

            def on_step_end(self, args, state, control, **kwargs):
                recorder.end()

        return StepClock()

    def steps(self) -> list[dict]:
        """One dict per optimizer step: step, seconds, tokens, examples, checksum, loss (numbers, after training)."""
        return [
            {
                "step": i + 1,
                "seconds": raw["seconds"],
                "tokens": int(sum(_number(m["tokens"]) for m in raw["micro"])),
                "examples": int(sum(_number(m["examples"]) for m in raw["micro"])),
                "checksum": int(sum(_number(m["checksum"]) for m in raw["micro"])),
                "loss": sum(_number(m["loss"]) for m in raw["micro"]),
            }
            for i, raw in enumerate(self.raw)
        ]

    def memory(self) -> dict:
        """Peak allocated GiB over the whole run, over the training steps alone, and before the first step."""
        if not self.cuda:
            return {"peak_memory_gib": None, "peak_memory_steps_gib": None, "peak_before_steps_gib": None}
        steps = max(torch.cuda.max_memory_allocated(self.device), self.folded)
        return {
            "peak_memory_gib": max(steps, self.peak_before_steps) / _GIB,
            "peak_memory_steps_gib": steps / _GIB,
            "peak_before_steps_gib": self.peak_before_steps / _GIB,
        }


def step_statistics(steps: list[dict], warmup: int, whole_run_seconds: float) -> dict:
    """The row's rates (real tokens/s) from its steps; warm-up steps are left out of all but the whole run.

    median_tokens_per_s: the median over the timed steps of each step's tokens / seconds;
    steady_tokens_per_s: the timed steps' tokens / their seconds, stalls left out;
    timed_tokens_per_s: the same with the stalls in; whole_run_tokens_per_s: every step's tokens over the wall
    time from the first step's start to the last step's end (loading, logging, warm-up and stalls included).
    Stalls: steps anywhere (warm-up too) slower than STALL_FACTOR x the timed steps' median.

    >>> steps = [{"step": i + 1, "tokens": 100, "seconds": s} for i, s in enumerate([9.0, 1.0, 1.0, 5.0, 1.0, 1.0])]
    >>> stats = step_statistics(steps, warmup=1, whole_run_seconds=20.0)
    >>> stats["median_tokens_per_s"], stats["steady_tokens_per_s"], stats["whole_run_tokens_per_s"]
    (100.0, 100.0, 30.0)
    >>> [s["step"] for s in stats["stalls"]], stats["timed_tokens_per_s"]
    ([1, 4], 55.55555555555556)
    """
    timed = steps[warmup:] or steps
    median_s = statistics.median(s["seconds"] for s in timed)
    stalls = [s for s in steps if s["seconds"] > STALL_FACTOR * median_s]
    steady = [s for s in timed if s not in stalls] or timed
    rate = lambda group: sum(s["tokens"] for s in group) / sum(s["seconds"] for s in group)  # noqa: E731
    return {
        "median_step_s": median_s,
        "median_tokens_per_s": statistics.median(s["tokens"] / s["seconds"] for s in timed),
        "steady_tokens_per_s": rate(steady),
        "timed_tokens_per_s": rate(timed),
        "whole_run_tokens_per_s": sum(s["tokens"] for s in steps) / whole_run_seconds,
        "mean_tokens_per_step": sum(s["tokens"] for s in timed) / len(timed),
        "timed_steps": len(timed),
        "stalls": [{k: s[k] for k in ("step", "seconds", "tokens")} for s in stalls],
        "stall_seconds": sum(s["seconds"] for s in stalls),
    }


def fa4_int_lengths() -> dict:
    """Route FA4's varlen kernel through ulysses_vs_deepspeed.py's int-lengths wrapper, counting the calls it fixes.

    transformers 5.17 hands FA4 its max lengths as 0-d tensors when it derives the examples from position_ids,
    which FA4 4.0.0b36 refuses; the wrapper passes ints. Installed before the model is built, in every CUDA
    setting alike (this library's packing_fa4 and transformers' flash_attention_4 both call the function it
    replaces). Returns the counters, filled as training runs ({"installed": False} without FA4).
    """
    try:
        import flash_attn.cute as cute
    except ImportError:
        return {"installed": False}
    from ulysses_vs_deepspeed import _fa4_int_lengths  # beside this file: the wrapper, one home

    _fa4_int_lengths()
    wrapped, seen = cute.flash_attn_varlen_func, {"installed": True, "calls": 0, "tensor_lengths": 0}

    def counted(*args, max_seqlen_q=None, max_seqlen_k=None, **kwargs):
        seen["calls"] += 1
        seen["tensor_lengths"] += int(torch.is_tensor(max_seqlen_q) or torch.is_tensor(max_seqlen_k))
        return wrapped(*args, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **kwargs)

    cute.flash_attn_varlen_func = counted
    return seen


def seconds_since_process_start() -> float:
    """Wall seconds since this process started: from ``/proc`` (Linux; the interpreter's start, clock ticks), else
    since this module was imported.

    >>> 0 <= seconds_since_process_start() < 24 * 3600
    True
    """
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime, after the name
            return float(uptime.read().split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


TRITON_KERNEL_MODULES = (
    "packing_collators.fused._swiglu_kernels",
    "packing_collators.fused._rope_kernels",
    "packing_collators.loss._triton_kernels",
)


def triton_variants() -> dict:
    """How many variants of each of the library's Triton kernels this process built (its checks' included): each is a
    compile, seconds on a fresh machine. Kernels never imported are left out; {} where Triton's cache is not readable
    (its ``device_caches``: Triton >= 3.2)."""
    import sys

    counts = {}
    for module_name in TRITON_KERNEL_MODULES:
        module = sys.modules.get(module_name)
        for name, kernel in vars(module).items() if module is not None else ():
            caches = getattr(kernel, "device_caches", None)
            if isinstance(caches, dict):
                counts[f"{module_name.rsplit('.', 1)[1]}.{name}"] = sum(len(cache[0]) for cache in caches.values())
    return counts


def versions() -> dict:
    """The versions of the packages a row depends on (None where one is not installed)."""
    found = {}
    for name, dists in {
        "torch": ("torch",),
        "transformers": ("transformers",),
        "accelerate": ("accelerate",),
        "trl": ("trl",),
        "datasets": ("datasets",),
        "flash_attn": ("flash-attn-4", "flash_attn_4", "flash-attn", "flash_attn"),
        "packing_collators": ("packing-collators", "packing_collators"),
    }.items():
        found[name] = next((v for v in map(_dist_version, dists) if v), None)
    if found["packing_collators"] is None:  # run from a checkout (PYTHONPATH), not installed
        import packing_collators

        found["packing_collators"] = packing_collators.__version__
    return found


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
