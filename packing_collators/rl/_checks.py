"""The RL trainers' checks when training begins: the packed layout on the policy and the reference.

    the probe's rows (FlatteningCollator)       check_packing_support + probe_packing, refused with the numbers
    with share_prompt: synthetic groups         one prompt, three completions: their log-probabilities shared must
                                                equal them unshared, and changing one completion must leave the
                                                others as they were (a leak); one group as long as training's
    FlashAttention-4                            its kernels compiled up to the longest sequence

No completion exists before the first generation, so the shared layout is measured on token groups of the
model's vocabulary, one of them as long as a prompt and completion may be, at most the model's context (a window
the short ones fit in is seen). Cost: the probe's few forwards per model, four more with ``share_prompt``; once.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from transformers import TrainerCallback

from .._compat import attn_implementation
from .._rank_agreement import refuse_together
from .._model_unwrap import probe_module, text_config
from ..attention import attention_kind
from ..checks import probe_dtype, probe_packing, refuse_failed_probe, refuse_shared_layout_change, tokenwise_experts
from ..collate import FlatteningCollator
from ..trainer import training_autocast, warm_up_packed_attention

__all__ = ["RLCheckCallback"]

logger = logging.getLogger(__name__)


class RLCheckCallback(TrainerCallback):
    """Probe the policy and the reference, measure the shared layout, warm FA4 up: before the first step."""

    def __init__(self, trainer, *, probe: bool = True) -> None:
        self.trainer, self.probe, self.reports = trainer, probe, []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        trainer = self.trainer
        _warn_dropout(probe_module(model), type(trainer).__name__)
        device = next(probe_module(model).parameters()).device
        refuse_together(lambda: self._checks(model, args), device, type(trainer).__name__)  # on every rank alike
        warm_up_packed_attention(model, _longest(trainer, probe_module(model)), args)

    def _checks(self, model, args) -> None:
        """The heads, the probe and the shared layout's check: a ValueError refuses the set-up."""
        trainer = self.trainer
        for each in [model] + ([trainer.ref_model] if trainer.ref_model is not None else []):
            trainer._heads(each)  # each head checked (and a head that cannot project as TRL's refused) before step 1
        if self.probe:
            for each in [model] + ([trainer.ref_model] if trainer.ref_model is not None else []):
                report = probe_packing(probe_module(each), FlatteningCollator(), autocast=training_autocast(args, each))
                logger.info("%s: %s", type(trainer).__name__, report.summary())
                self.reports.append(report)
                refuse_failed_probe(report, attention_kind(attn_implementation(text_config(each))))
            if trainer.share_prompt:
                self._check_shared(model, args)

    def _check_shared(self, model, args) -> None:
        """Refuse a model on which the shared layout changes a completion's log-probabilities or leaks."""
        trainer, module = self.trainer, probe_module(model)
        vocab = int(text_config(module).vocab_size)
        generator = torch.Generator().manual_seed(0)
        device = next(module.parameters()).device

        def group(prompt: int, completions: list[int]) -> torch.Tensor:
            ids = torch.randint(3, vocab, (len(completions), prompt + max(completions)), generator=generator)
            ids[:, :prompt] = ids[0, :prompt]
            mask = torch.zeros_like(ids)
            for i, c in enumerate(completions):
                mask[i, : prompt + c] = 1
            return ids.to(device), mask.to(device), max(completions)

        was_training = module.training
        module.eval()
        try:
            with torch.no_grad(), training_autocast(args, module) or contextlib.nullcontext(), tokenwise_experts(module):
                longest = _longest(trainer, module)
                for ids, mask, keep in (group(9, [5, 3, 7]), group(max(2, longest // 2), [longest - longest // 2] * 2)):
                    found = [self._logps(module, ids, mask, keep, share) for share in (False, True)]
                    changed = ids.clone()
                    changed[0, -keep:] = (changed[0, -keep:] + 1) % vocab
                    leaked = self._logps(module, changed, mask, keep, True)
                    self._judge(found, leaked, module, args)
        finally:
            module.train(was_training)

    def _logps(self, module, ids, mask, keep, share: bool) -> torch.Tensor:
        """The rows' log-probabilities, laid in the order given: a changed completion would otherwise move its group's
        others to new offsets in training's order, which rounds them anew without leaking."""
        trainer = self.trainer
        was, trainer.share_prompt = trainer.share_prompt, share
        try:
            return trainer._get_per_token_logps_and_entropies(module, ids, mask, keep, rows_as_given=True)[0].float()
        finally:
            trainer.share_prompt = was

    def _judge(self, found, leaked, module, args) -> None:
        difference = float((found[0] - found[1]).abs().max())
        dtype = probe_dtype(training_autocast(args, module), next(module.parameters()))
        exact = dtype in ("float32", "float64")  # half-precision kernels round by the row's content
        scale = max(1.0, float(found[0].abs().max()))  # float32 rounds a log-probability of -20 to ~1e-6 of it
        allowed = (1e-5 if exact else 1e-2) * scale  # of a token's log-probability
        leak = float((leaked[1:] - found[1][1:]).abs().max())
        refuse_shared_layout_change(type(self.trainer).__name__, difference, leak, exact=exact, allowed=allowed,
                                    moved="one completion moves its group's others")  # fmt: skip


def active_dropout(module) -> list[str]:
    """What drops activations while ``module`` trains: its Dropout layers with p > 0 and its config's attention
    dropout (passed to the attention as a number, no layer).

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> active_dropout(GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=16)))
    ['attn_pdrop=0.1', 'embd_pdrop=0.1', 'resid_pdrop=0.1', 'Dropout(p=0.1) x4']
    """
    config = text_config(module)
    names = ("attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop", "hidden_dropout", "dropout")
    found = [f"{name}={getattr(config, name)}" for name in names
             if isinstance(getattr(config, name, None), float) and getattr(config, name) > 0]  # fmt: skip
    layers = [m.p for m in module.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    return found + ([f"Dropout(p={max(layers):g}) x{len(layers)}"] if layers else [])


def _warn_dropout(module, who: str) -> None:
    """Say that a run with dropout on equals TRL's in distribution, not number for number."""
    found = active_dropout(module)
    if found:
        logger.warning(
            "%s: dropout is on while training (%s): the packed and the padded forwards draw their own dropout masks, "
            "so losses and log-probabilities equal TRL's in distribution, not number for number. For a run that equals "
            "TRL's: GRPOConfig(disable_dropout=True), and the config's attention dropout 0.", who, ", ".join(found))


def _longest(trainer, module) -> int:
    """The longest prompt + completion a training forward may hold: TRL's limits (a prompt 512 tokens where TRL sets
    none), at most the model's context (its position embeddings or configured positions).

    >>> from types import SimpleNamespace as Space
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_positions=128, n_embd=8, n_layer=1, n_head=2, vocab_size=16))
    >>> trainer = Space(max_completion_length=12, args=Space())
    >>> _longest(trainer, model), _longest(Space(max_completion_length=12, args=Space(max_prompt_length=64)), model)
    (128, 76)
    """
    prompt = getattr(trainer, "max_prompt_length", None) or getattr(trainer.args, "max_prompt_length", None) or 512
    longest = int(prompt) + int(trainer.max_completion_length)
    config = text_config(module)
    context = next((getattr(config, name) for name in _CONTEXT if isinstance(getattr(config, name, None), int)), None)
    return min(longest, context) if context else longest


_CONTEXT = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")
