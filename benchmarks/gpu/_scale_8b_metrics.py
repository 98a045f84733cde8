"""scale_8b.py's arithmetic: parameters, FLOPs per token, MFU, and torchtitan's step lines. Pure Python, no torch.

FLOPs per token, counted as torchtitan counts them (torchtitan 0.2.2, ``models/utils.py``,
``get_dense_model_nparams_and_flops``, the count behind the ``mfu`` of its logs)::

    6 * (N - N_embedding)  +  12 * L * H * d_head * S
    (every weight matrix: 2 FLOPs per multiply-add, forward + 2x backward; the output head counts, the input
     embedding does not)  +  (attention's two matmuls over S keys per query, fwd + bwd; no recompute)

with S the row length (8,192): every query is charged the whole row, causal or not, documents or not ("we follow
the convention and do not account for sparsity in causal attention"). For Llama-3.1-8B: N = 8,030,261,248,
N_embedding = 525,336,576, so 45.03 GFLOP of matmuls + 12.88 GFLOP of attention = 57.91 GFLOP per token; at
torchtitan's published 5,762 tokens/s per H100 that is 33.7% of 989 TFLOP/s, the 33% its benchmark page quotes.
``mfu`` below is that count; ``mfu_causal_documents`` charges each query only the keys it attends to (its own
document, causally: 12 * L * H * d_head * sum(n (n + 1) / 2) / sum(n) over the documents trained), the work a
packed row really needs. Activation-checkpointing recompute counts in neither. Peak: H100 SXM bf16 dense,
989 TFLOP/s (torchtitan's ``get_peak_flops`` for H100 SXM and H200 alike).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

H100_BF16_PEAK = 989e12  # FLOP/s, dense bf16, H100 SXM (and H200): torchtitan's get_peak_flops


@dataclass(frozen=True)
class Shape:
    """A Llama-style decoder: hidden, layers, heads, kv heads, MLP, vocabulary (untied embeddings)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


LLAMA_3_1_8B = Shape(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256)
TINY = Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=256)  # --smoke


def parameters(shape: Shape) -> tuple[int, int]:
    """(all parameters, the input embedding's) of a Llama model of ``shape``: q/k/v/o, gated MLP, two RMSNorms per
    layer, a final norm, an untied output head.

    >>> parameters(LLAMA_3_1_8B)
    (8030261248, 525336576)
    """
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    layer = 2 * h * h + 2 * h * kv + 3 * h * shape.intermediate + 2 * h
    embedding = shape.vocab * h
    return embedding + shape.layers * layer + h + shape.vocab * h, embedding


def attention_flops_per_key(shape: Shape) -> int:
    """FLOPs of one query attending to one key, forward and backward, all layers and heads: 12 * L * H * d_head."""
    return 12 * shape.layers * shape.heads * shape.head_dim


def flops_per_token(shape: Shape, seq_len: int) -> int:
    """torchtitan's FLOPs per token: 6 * (N - N_embedding) + 12 * L * H * d_head * seq_len.

    >>> flops_per_token(LLAMA_3_1_8B, 8192)
    57914449920
    """
    total, embedding = parameters(shape)
    return 6 * (total - embedding) + attention_flops_per_key(shape) * seq_len


def causal_document_flops_per_token(shape: Shape, documents: list[int]) -> float:
    """FLOPs per token when each query attends causally within its own document (``documents``: their lengths).

    >>> round(causal_document_flops_per_token(LLAMA_3_1_8B, [8192]) / 1e9, 3)  # one causal row: half the attention
    51.473
    """
    total, embedding = parameters(shape)
    keys = sum(n * (n + 1) / 2 for n in documents) / max(1, sum(documents))
    return 6 * (total - embedding) + attention_flops_per_key(shape) * keys


def flops_row(args) -> int:
    """The row length MFU charges attention over, as torchtitan charges its ``seq_len``: the budget, or the longest
    document where a budget packs several of torchtitan's rows (``--tokens-per-batch 16384``: its local batch 2).

    >>> from types import SimpleNamespace
    >>> flops_row(SimpleNamespace(tokens_per_batch=16384, max_length=8192))
    8192
    """
    return min(args.tokens_per_batch, args.max_length)


def mfu(flops: float, tokens_per_s_per_gpu: float, peak: float = H100_BF16_PEAK) -> float:
    """Model FLOPs utilisation, a fraction: FLOPs per token * tokens/s per GPU / the GPU's peak.

    >>> round(mfu(flops_per_token(LLAMA_3_1_8B, 8192), 5762), 4)  # torchtitan's published 8-GPU FSDP figure
    0.3374
    """
    return flops * tokens_per_s_per_gpu / peak


# ----------------------------------------------------------------------------- torchtitan's logs
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STEP = re.compile(
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)\s+grad_norm:\s*(?P<grad_norm>\S+)\s+"
    r"memory:\s*(?P<memory_gib>-?[\d.]+)GiB\((?P<memory_pct>-?[\d.]+)%\)\s+tps:\s*(?P<tps>[\d,]+)\s+"
    r"tflops:\s*(?P<tflops>[\d,.]+)\s+mfu:\s*(?P<mfu_pct>[\d.]+)%"
)
PEAK = re.compile(r"Peak FLOPS used for computing MFU:\s*(?P<peak>[\d.e+]+)")
SIZE = re.compile(r"size:\s*(?P<parameters>[\d,]+) total parameters")


def parse_titan_log(text: str) -> dict:
    """torchtitan's per-step metric lines (``MetricsProcessor.log``: ``step: 3  loss: ...  tps: 6,012  tflops: ...
    mfu: ...%``, colour codes or not, any ``[rank0]:`` prefix), its peak FLOP/s and its parameter count.

    ``tps`` is its tokens/s per GPU over the step (every token of the row: labels.numel()), ``mfu_pct`` its own MFU.

    >>> parse_titan_log("[rank0]:[titan] 2026-11-27 10:00:00,000 - root - INFO - step:  2  loss: 11.83021  "
    ...                 "grad_norm:  3.1125  memory: 41.20GiB(52.07%)  tps: 6,012  tflops: 348.19  mfu: 35.21%")["steps"]
    [{'step': 2, 'loss': 11.83021, 'grad_norm': 3.1125, 'memory_gib': 41.2, 'memory_pct': 52.07, 'tps': 6012.0, 'tflops': 348.19, 'mfu_pct': 35.21}]
    """
    steps, peak, size = [], None, None
    for line in ANSI.sub("", text).splitlines():
        match = STEP.search(line)
        if match:
            row = {k: float(v.replace(",", "")) for k, v in match.groupdict().items()}
            row["step"] = int(row["step"])
            steps.append(row)
        elif PEAK.search(line):
            peak = float(PEAK.search(line)["peak"])
        elif SIZE.search(line) and size is None:
            size = int(SIZE.search(line)["parameters"].replace(",", ""))
    return {"steps": steps, "peak_flops": peak, "parameters": size}


def steady(values: list[float], skip: int) -> float | None:
    """The median of ``values`` after the first ``skip`` (the steps that compile or warm up); None if none left.

    >>> steady([100.0, 5000.0, 6000.0, 6100.0], 1)
    6000.0
    """
    rest = values[skip:]
    return float(statistics.median(rest)) if rest else None
