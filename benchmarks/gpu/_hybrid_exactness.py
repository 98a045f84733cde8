"""``hybrid_throughput.py``'s exactness part: a few examples packed in one row against each example alone.

    runs (float32, then bf16 on a GPU)                              what it isolates
    packed        the examples in one row (enable_packing's path)
    alone         each example alone: the layer's own code           packed vs alone: the answer a user wants
                  (transformers' torch path for Mamba2 without
                  mamba-ssm, fla's own kernels where it imports them)
    kernel_alone  each example first in a row of its own, a 1-token   packed vs kernel_alone: packing alone
                  example after it: the same varlen kernels, no       (no kernel-vs-torch numerics)
                  example before it
    padded        the examples in one right-padded batch              padded vs alone: bf16's noise for the
                                                                      same math in another layout

and in float32 the gradients of a weighted sum of the logits, packed against alone (the varlen
kernels' backward against the layer's own). bf16's distance from exact is ``alone`` bf16 against
float32. Cost: a few forwards and two backwards of the model on ~2k tokens.
"""

from __future__ import annotations

import torch
from _model_runs import gaps, set_attention
from _shared import lengths_of, markov_tokens, padded_batch, to_device

from packing_collators import FlatteningCollator
from packing_collators.models import find_stateful_layers


def _logits(model, batch: dict, device) -> torch.Tensor:
    return model(**to_device(batch, device)).logits


def _runs(model, examples: list[dict], device, attn: str, precision: str) -> dict[str, torch.Tensor]:
    lengths = [len(e["input_ids"]) for e in examples]
    packed = FlatteningCollator()(examples)
    packed.pop("labels")
    padded = padded_batch(examples, multiple=1)
    runs = {}
    set_attention(model, attn)
    runs["packed"] = _logits(model, packed, device)[0].float()
    alone, kernel_alone = [], []
    for example in examples:
        kernel_alone.append(_logits(model, _kernel_row(example), device)[0, : len(example["input_ids"])].float())
        set_attention(model, "sdpa")
        alone.append(_logits(model, {"input_ids": torch.tensor([example["input_ids"]])}, device)[0].float())
        set_attention(model, attn)
    runs["alone"], runs["kernel_alone"] = torch.cat(alone), torch.cat(kernel_alone)
    set_attention(model, "sdpa")
    logits = _logits(model, {k: padded[k] for k in ("input_ids", "attention_mask")}, device)
    runs["padded"] = torch.cat([logits[i, :n].float() for i, n in enumerate(lengths)])
    return {f"{name}_{precision}": value for name, value in runs.items()}


def _weighted(logits: torch.Tensor) -> torch.Tensor:
    weights = torch.randn(logits.shape[-2:], generator=torch.Generator().manual_seed(1)).to(logits.device)
    return (logits.reshape(-1, logits.shape[-1]).float() * weights).sum()


def _kernel_row(example: dict) -> dict:
    """The example first in a row of its own, a 1-token example after it: the varlen kernels, no example before."""
    row = FlatteningCollator()([example, {"input_ids": example["input_ids"][:1]}])
    row.pop("labels")
    return row


def gradient_gap(model, examples: list[dict], device) -> dict:
    """max |grad packed - grad other| / max |grad other| per parameter (float32, sdpa), other = each example alone
    through the layer's own code, and each example alone on the same varlen kernels (``kernel_alone``: what packing
    changes, without the kernels' arithmetic against the layer's): the worst, its name, and the worst over the
    stateful layers' parameters."""
    set_attention(model, "sdpa")
    packed = FlatteningCollator()(examples)
    packed.pop("labels")
    lengths = [len(e["input_ids"]) for e in examples]
    calls = {
        "packed": [(packed, sum(lengths))],
        "alone": [({"input_ids": torch.tensor([e["input_ids"]])}, n) for e, n in zip(examples, lengths)],
        "kernel_alone": [(_kernel_row(e), n) for e, n in zip(examples, lengths)],
    }
    grads = {}
    for name, batches in calls.items():
        model.zero_grad(set_to_none=True)
        _weighted(torch.cat([_logits(model, batch, device)[0, :n] for batch, n in batches])).backward()
        grads[name] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    layers = tuple(f"{name}." for name, _ in find_stateful_layers(model))
    out = {}
    for other, suffix in (("alone", "vs_alone"), ("kernel_alone", "vs_kernel_alone")):
        reference = grads[other]
        gap = {n: float((grads["packed"][n] - g).abs().max() / g.abs().max().clamp(min=1e-12))
               for n, g in reference.items()}  # fmt: skip
        worst = max(gap, key=gap.get)
        stateful = [v for n, v in gap.items() if n.startswith(layers)]
        out |= {
            f"float32_grad_rel_diff_{suffix}": gap[worst],
            f"float32_grad_worst_parameter{'' if other == 'alone' else '_' + suffix}": worst,
            f"float32_grad_rel_diff_stateful_layers{'' if other == 'alone' else '_' + suffix}": max(stateful)
            if stateful
            else None,
        }
        out.setdefault("parameters_compared", len(gap))
    return out


def exactness(args, model, device) -> dict:
    """max |logit diff| of the examples packed vs alone (and vs alone on the same kernels), in bf16 and float32,
    bf16's own noise beside them, and the float32 gradients' gap."""
    lengths = lengths_of("sft", args.check_examples, seed=1)
    examples = [{"input_ids": t.tolist()} for t in markov_tokens(lengths, model.config.vocab_size, seed=1)]
    model.eval()
    runs, out = {}, {"examples": [int(n) for n in lengths]}
    dtype = next(model.parameters()).dtype
    for precision in ("float32", "bfloat16") if device.type == "cuda" else ("float32",):
        model.to(getattr(torch, precision))
        attn = args.attn if precision == "bfloat16" else "sdpa"  # packing_varlen needs a half dtype
        with torch.no_grad():
            runs.update(_runs(model, examples, device, attn, precision))
        if precision == "float32":
            try:
                out.update(gradient_gap(model, examples, device))
            except Exception as error:  # noqa: BLE001 - a kernel without a float32 backward: say so, keep timing
                out["float32_grad_error"] = f"{type(error).__name__}: {error}"[:400]
    model.to(dtype).train()
    low = "bfloat16" if device.type == "cuda" else "float32"
    out.update(gaps(runs, low))
    out["packed_vs_kernel_alone"] = float((runs[f"packed_{low}"] - runs[f"kernel_alone_{low}"]).abs().max())
    out["float32_packed_vs_kernel_alone"] = float((runs["packed_float32"] - runs["kernel_alone_float32"]).abs().max())
    out["kernel_alone_vs_alone"] = float((runs[f"kernel_alone_{low}"] - runs[f"alone_{low}"]).abs().max())
    return out
