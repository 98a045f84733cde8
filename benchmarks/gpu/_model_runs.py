"""What the hybrid and the vision-language GPU harnesses share: timing a mode's batches, the attention
switch, the exactness gaps and one results file per harness that each model's run merges into."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from _shared import sync, to_device  # noqa: E402  (the harness put benchmarks/ on sys.path)


def set_attention(model, name: str) -> None:
    """The attention implementation of the language model (a VLM's vision tower keeps its own)."""
    text = model.config.get_text_config()
    text._attn_implementation = name
    if text is model.config or not hasattr(model.config, "vision_config"):
        model.config._attn_implementation = name


def timed(model, batches: list[dict], device, warmup: int, tokens_of) -> dict:
    """Real tokens/s of forward + backward over ``batches[warmup:]`` (``tokens_of(batch)`` real tokens each), and
    each timed step's milliseconds on the GPU (CUDA events: no synchronisation between the steps)."""
    for batch in batches[:warmup]:
        model(**to_device(batch, device)).loss.backward()
    model.zero_grad(set_to_none=True)
    sync(device)
    cuda = device.type == "cuda"
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(batches) - warmup + 1)] if cuda else []
    started, tokens = time.perf_counter(), 0
    for index, batch in enumerate(batches[warmup:]):
        if cuda:
            marks[index].record()
        model(**to_device(batch, device)).loss.backward()
        tokens += tokens_of(batch)
    if cuda:
        marks[-1].record()
    model.zero_grad(set_to_none=True)
    sync(device)
    seconds = time.perf_counter() - started
    steps_ms = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
    return {"real_tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens, "steps_ms": steps_ms}


def alternate_modes(plans: dict, rounds: int, device, warmup: int, tokens_of, label: str) -> dict:
    """Each mode's (model, attention, batches) timed once per round, the order reversed every other round;
    the median tokens/s per mode, every round's, and the ratios of ``packed`` to the others."""
    runs: dict[str, list[float]] = {name: [] for name in plans}
    steps_ms: dict[str, list[list[float]]] = {name: [] for name in plans}
    failed: dict[str, str] = {}  # a mode out of memory: said, and left out of the later rounds
    for round_ in range(rounds):
        for name in list(plans) if round_ % 2 == 0 else list(reversed(plans)):
            if name in failed:
                continue
            model, attention, batches = plans[name]
            set_attention(model, attention)
            try:
                result = timed(model, batches, device, warmup, tokens_of)
            except torch.OutOfMemoryError as error:
                failed[name] = f"out of memory in round {round_}: {str(error).splitlines()[0]}"
                print(f"  {label} round {round_} {name}: {failed[name]}", flush=True)
                model.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                continue
            runs[name].append(result["real_tokens_per_s"])
            steps_ms[name].append([round(ms, 2) for ms in result["steps_ms"]])
            print(f"  {label} round {round_} {name}: {runs[name][-1]:,.0f} tokens/s", flush=True)
    median = {name: statistics.median(values) for name, values in runs.items() if values}
    out = {"tokens_per_s": median, "rounds_tokens_per_s": runs, "rounds_steps_ms": steps_ms}
    if failed:
        out["failed"] = failed
    for other in median:
        if other != "packed" and "packed" in median:
            out[f"packed_vs_{other}"] = median["packed"] / median[other]
    return out


def gaps(runs: dict[str, torch.Tensor], low: str) -> dict:
    """max |logit diff|: packed vs alone at ``low`` precision, and the references beside it."""

    def gap(a, b):
        return float((runs[a] - runs[b]).abs().max())

    return {
        "max_logit_diff_vs_alone": gap(f"packed_{low}", f"alone_{low}"),
        "padded_batch_vs_alone": gap(f"padded_{low}", f"alone_{low}"),
        "packed_vs_float32_alone": gap(f"packed_{low}", "alone_float32"),
        "alone_vs_float32_alone": gap(f"alone_{low}", "alone_float32"),
        "float32_packed_vs_alone": gap("packed_float32", "alone_float32"),
        "max_abs_logit": float(runs["alone_float32"].abs().max()),
    }


def write_merged(out: Path, report: dict) -> None:
    """``report`` under its ``model`` key in ``<out>/results.json`` (other models' runs kept)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged[report["model"]] = report
    path.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"wrote {path}")


def kernel_versions() -> dict:
    import importlib.metadata

    out = {}
    for name in ("fla-core", "flash-linear-attention", "mamba-ssm", "causal-conv1d", "triton", "transformers"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out
