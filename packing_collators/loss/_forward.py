"""One forward of a causal LM whose head computes the loss (or log-probabilities) a chunk at a time.

    inputs (no labels) -> model -> ... hidden (B, T, H) -> head_call: the N tokens with a target, compacted
                                                              -> weighted_cross_entropy -> loss    (training)
                                                              -> token_log_probs        -> (B, T)  (preferences)
                                                           <- an empty (B, T, 0) tensor as "logits"
    targets (B, T): what position t predicts: shift_labels[t] (a sequence shard's), else labels[t + 1]; -100: none

The loss is computed inside the model's call of its head, where DeepSpeed ZeRO-3 has gathered
the weight and FSDP has unsharded it; the model gets an empty ``(B, T, 0)`` tensor back as its
logits (what it does to them after costs nothing), made from the loss so that DDP, which looks for
the parameters in use from the forward's outputs, finds them; the model computes no loss of its
own (it is called without labels).
An MoE model's ``aux_loss`` is added as its own loss adds it. Cost: the chunked loss's own
(``_chunked.py``); one boolean selection of the target tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping

import torch

from ..batch import IGNORE_INDEX, TARGET_KEYS, shifted_targets
from ._chunked import token_log_probs, weighted_cross_entropy
from ._head import LossImplementation, OutputHead, checked_head, head_call

__all__ = ["add_aux_loss", "chunked_forward", "log_prob_forward", "training_loss"]


def _model_inputs(inputs: Mapping) -> dict:
    return {key: value for key, value in inputs.items() if key not in (*TARGET_KEYS, "num_items_in_batch")}


def _selected(hidden: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The hidden states of the positions with a target (``rows``: each position's row token, a gather)."""
    if rows is not None:
        flat = hidden.reshape(-1, hidden.shape[-1])
        return flat[rows.reshape(-1).to(hidden.device)[mask.reshape(-1).to(hidden.device)]]
    if tuple(hidden.shape[:2]) != tuple(mask.shape):
        raise ValueError(
            f"The model's head got hidden states {tuple(hidden.shape)} for a batch whose targets are "
            f"{tuple(mask.shape)}: the chunked loss needs one hidden state per token. Use loss_implementation='full'."
        )
    return hidden.reshape(-1, hidden.shape[-1])[mask.reshape(-1).to(hidden.device)]


@contextlib.contextmanager
def _projection(head: OutputHead):
    """While open, the head's chunks project as ``head`` asks: yields the cast of the hidden states (float32 with
    autocast off for a ``float32`` head, as TRL's ``cast_lm_head_to_fp32`` projects; else as they come)."""
    if not head.float32:
        yield lambda hidden: hidden
        return
    with torch.autocast(head.module.weight.device.type, enabled=False):
        yield lambda hidden: hidden.float()


def _run(model, inputs: Mapping, head: OutputHead, compute):
    """``model(**inputs)`` with ``compute(hidden)`` run in its head; (compute's result, the model's outputs)."""
    box: dict = {}

    def forward(hidden):
        box["result"] = result = compute(hidden)
        # "logits" of shape (B, T, 0), made from the result: DDP (find_unused_parameters) walks the graph
        # from a forward's outputs, and must find the head and every layer before it in use
        return result.reshape(-1)[:1].reshape(1, 1, 1)[..., :0].expand(*hidden.shape[:-1], 0).to(hidden.dtype)

    with head_call(head, forward):
        outputs = model(**_model_inputs(inputs))
    if "result" not in box:
        raise RuntimeError(
            f"{type(head.module).__name__} (the model's output embedding) was not called in the forward; the "
            "chunked loss cannot see the hidden states. Use loss_implementation='full'."
        )
    return box["result"], outputs


def chunked_forward(model, inputs: Mapping, head: OutputHead, targets: torch.Tensor, weights: torch.Tensor):
    """(``sum(weights * cross_entropy)`` over the tokens with a target, the model's outputs without logits).

    ``targets`` int64 (B, T) from :func:`shifted_targets`; ``weights`` float32 (B, T), aligned with them.
    """
    mask = targets != IGNORE_INDEX
    layer = head.module

    def compute(hidden):
        selected = _selected(hidden, mask)
        with _projection(head) as cast:
            return weighted_cross_entropy(
                cast(selected), layer.weight, layer.bias, targets[mask].to(selected.device),
                weights[mask].to(selected.device), head.transform,
            )

    return _run(model, inputs, head, compute)


def log_prob_forward(
    model, inputs: Mapping, head: OutputHead | None, targets: torch.Tensor, stats: dict | None = None, rows=None,
    temperature: float = 1.0, entropy_grad: bool = False,
):  # fmt: skip
    """(float32 (B, T): log p(target) at each position with a target, 0 elsewhere; the model's outputs).

    ``head`` None: from the model's own full logits (a head the chunked path cannot compute, such as a PEFT
    ``modules_to_save`` copy of ``lm_head``), the same numbers at the memory of the full logits.

    ``stats``: a dict filled with float32 (B, T) ``entropy``, ``mean_logits`` and ``is_top1`` at the same
    positions (0 elsewhere), without gradients but for the entropy where ``entropy_grad`` (see
    :func:`token_log_probs`). ``rows``: int64, shaped like
    ``targets``, the flat hidden-state row each target position reads (a layout whose positions repeat
    row tokens, such as a shared prompt's keys); default each position its own row. ``temperature``: the
    log-probabilities of the model's logits divided by it (after its softcap), as a sampler drew the tokens."""
    mask = targets != IGNORE_INDEX
    if head is None:
        return _full_logit_log_probs(model, inputs, targets, mask, stats, rows, temperature, entropy_grad)
    if temperature != 1.0:
        head = dataclasses.replace(head, transform=dataclasses.replace(head.transform, temperature=float(temperature)))
    layer = head.module

    def compute(hidden):
        selected = _selected(hidden, mask, rows)
        found: dict | None = {} if stats is not None else None
        with _projection(head) as cast:
            per_token = token_log_probs(
                cast(selected), layer.weight, layer.bias, targets[mask].to(selected.device), head.transform,
                stats=found, entropy_grad=entropy_grad,
            )
        where = mask.to(per_token.device)
        for name, values in (found or {}).items():
            stats[name] = torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(where, values)
        out = torch.zeros(mask.shape, dtype=per_token.dtype, device=per_token.device)
        return out.masked_scatter(where, per_token)

    return _run(model, inputs, head, compute)


def _full_logit_log_probs(model, inputs: Mapping, targets, mask, stats: dict | None, rows, temperature: float = 1.0,
                          entropy_grad: bool = False):  # fmt: skip
    """:func:`log_prob_forward` from the model's own logits (B, T, V), which hold whatever its head applies."""
    from ._chunked import _token_stats

    outputs = model(**_model_inputs(inputs))
    logits = outputs["logits"]
    flat = logits.reshape(-1, logits.shape[-1])
    where = mask.reshape(-1).to(logits.device)
    picked = rows.reshape(-1).to(logits.device)[where] if rows is not None else where.nonzero().squeeze(-1)
    selected = flat[picked].float()
    if temperature != 1.0:
        selected = selected / temperature
    wanted = targets.to(logits.device)[mask.to(logits.device)]
    per_token = torch.log_softmax(selected, dim=-1).gather(-1, wanted[:, None]).squeeze(-1)
    if stats is not None:
        found: dict = {}
        with torch.no_grad():
            _token_stats(selected.detach(), wanted, slice(None), found, wanted.numel())
        if entropy_grad:
            log_p = torch.log_softmax(selected, dim=-1)
            found["entropy"] = -(log_p.exp() * log_p).sum(-1)
        for name, values in found.items():
            stats[name] = torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(where.reshape(mask.shape), values)
    out = torch.zeros(mask.shape, dtype=per_token.dtype, device=per_token.device)
    return out.masked_scatter(where.reshape(mask.shape), per_token), outputs


def add_aux_loss(loss: torch.Tensor, outputs, head: OutputHead, scale: float = 1.0) -> torch.Tensor:
    """``loss + aux_coef * aux_loss * scale`` when the model returned an MoE ``aux_loss``, as its own loss adds it."""
    aux = outputs.get("aux_loss") if isinstance(outputs, Mapping) else getattr(outputs, "aux_loss", None)
    if aux is None or not head.aux_coef:
        return loss
    return loss + head.aux_coef * scale * aux.to(loss.device)


def training_loss(model, implementation: LossImplementation = "auto"):
    """``batch -> loss``: the model's own token-mean training loss of a batch with labels, a chunk of tokens at a
    time where its head allows it (checked once, here), else from its full logits. For dry runs that must hold
    what training holds (the token budget's).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from packing_collators import FlatteningCollator
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
    ...                                      num_attention_heads=2, intermediate_size=16))
    >>> batch = FlatteningCollator()([{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11]}])
    >>> bool(torch.allclose(training_loss(model)(batch), model(**batch).loss))
    True
    """
    head, _ = checked_head(model, implementation)
    if head is None:
        return lambda batch: model(**batch).loss

    def loss(batch):
        targets = shifted_targets(batch)
        weights = torch.ones(targets.shape, dtype=torch.float32, device=targets.device)
        weights = weights / (targets != IGNORE_INDEX).sum().clamp(min=1)
        value, outputs = chunked_forward(model, batch, head, targets, weights)
        return add_aux_loss(value, outputs, head)

    return loss
