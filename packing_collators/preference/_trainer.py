"""PackingDPOTrainer: TRL's DPOTrainer with each micro-batch of pairs in one packed row.

    DPOTrainer (TRL >= 1.16)         datasets in any format TRL takes, DPOConfig, ref model / PEFT, metrics
      + PreferenceCollator           a micro-batch's pairs -> one row: [P1 C1 | P1 R1 | P2 C2 | ...]
      + pair_log_probs               policy (and reference) log-probabilities a chunk of tokens at a time
      + PreferenceLoss               every loss_type of DPOConfig, from the sequences' log-probabilities
      + enable_packing, the probe    hybrids and VLM-free models keep the row's sequences apart, checked
      + max_tokens_per_batch         whole pairs fill a token budget (MultipackBatchSampler), never split

By default a micro-batch holds ``per_device_train_batch_size`` pairs, as TRL's (the same steps); the
loss, its gradients and the metrics TRL logs (``rewards/*``, ``logps/*``, ``logits/*``, entropy, token
accuracy) equal TRL's padded ``DPOTrainer`` on the same pairs (tests/preference). Cost: one packed
forward of the policy and one of the reference per micro-batch, no padding, no full logits.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Literal

import torch

from .._model_unwrap import unwrap_model
from .._validation import validate_flag
from ..budget import TrainerBudget
from ..loss import CheckedHeads
from ._collator import PAIR_CHOSEN_TARGETS, PAIR_COUNT, PreferenceCollator
from ._logps import PairLogProbs, pair_log_probs
from ._losses import F_DIVERGENCE_LOSSES, PairValues, PreferenceLoss

try:
    from trl import DPOConfig, DPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter
except ImportError as error:  # pragma: no cover - trl is an optional dependency
    raise ImportError("PackingDPOTrainer builds on TRL's DPOTrainer: pip install 'trl>=1.16'.") from error

__all__ = ["PackingDPOTrainer"]

logger = logging.getLogger(__name__)


BATCH_SORTED_LOSSES = ("aot", "aot_unpaired")  # sort the micro-batch's pairs: the loss depends on which pairs meet


def _refuse_options(args, max_tokens_per_batch=None) -> None:
    loss = PreferenceLoss.from_config(args)
    if max_tokens_per_batch is not None:
        sorted_types = sorted(set(PreferenceLoss.from_config(args).loss_types) & set(BATCH_SORTED_LOSSES))
        if sorted_types:
            raise ValueError(
                f"loss_type {sorted_types} sorts each micro-batch's pairs against each other, so its loss depends on "
                f"which pairs a micro-batch holds, and max_tokens_per_batch={max_tokens_per_batch!r} groups them "
                "other than TRL's batches would: the loss would not be TRL's. Use max_tokens_per_batch=None "
                "(per_device_train_batch_size pairs per micro-batch, as TRL's), or another loss type."
            )
    if getattr(args, "use_weighting", False) and max_tokens_per_batch is not None and "sft" in loss.loss_types:
        raise ValueError(
            "use_weighting=True with the 'sft' loss under max_tokens_per_batch: WPO weighs TRL's batch mean of 'sft' by "
            "the batch's pair weights, and a budget's micro-batches are not TRL's batches. Use max_tokens_per_batch=None "
            "(per_device_train_batch_size pairs per micro-batch, as TRL's), or leave 'sft' out."
        )
    if loss.f_divergence_type != "reverse_kl" and not set(loss.loss_types) <= F_DIVERGENCE_LOSSES:
        raise ValueError(f"f_divergence_type={loss.f_divergence_type!r} works with {sorted(F_DIVERGENCE_LOSSES)} only.")


def _loadable(model) -> bool:
    """Whether TRL can load the reference model from the policy's name or path (else it is deep-copied)."""
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return bool(name) and (os.path.isdir(name) or "/" in name)


class PackingDPOTrainer(DPOTrainer):
    """TRL's ``DPOTrainer`` trained on packed rows (see the module docstring).

    Takes what ``DPOTrainer`` takes (``model``, ``ref_model``, ``args`` a ``DPOConfig``, datasets, ``processing_class``,
    ``peft_config``, ...), and keyword-only:

    Args:
        max_tokens_per_batch: None (default): ``per_device_train_batch_size`` pairs per micro-batch, as TRL's; or a
            token budget that whole pairs fill (``MultipackBatchSampler``: a pair is never split across micro-batches
            or ranks; the count of steps per epoch changes with it); or ``"auto"``: the budget measured on the
            policy's GPU for the longest pair (``budget.measure_token_budget``, the smallest over ranks), as
            PackingTrainer measures it. Every pair of an optimizer step weighs the same (its pairs counted over the
            accumulated micro-batches and the ranks), as in TRL's batch of them.
        memory_check: with a number of tokens, check before the first step that a micro-batch of them fits the
            GPU (a training step of the policy on that many tokens; the reference's forward holds no activations).
        share_prompt: lay each pair's prompt once, its completions after it (``PreferenceCollator``); needs an
            attention that reads the shared layout (``packing_fa4``, ``packing_varlen``, sdpa/eager).
        packing_probe: run the live equivalence probe on the policy (and the reference) before the first step.

    These options mean what PackingTrainer's of the same name mean and are checked the same way, when the trainer
    is built.

    Without a ``ref_model`` (and no PEFT adapter or precomputed reference), the reference is TRL's own (loaded
    from the policy's name) or, for a model built in memory, a deep copy of it. Vision-language preference data
    is refused. ``use_weighting`` (WPO) weighs each pair as TRL's does.
    """

    def __init__(
        self,
        model,
        ref_model=None,
        args: DPOConfig | None = None,
        data_collator=None,
        *a,
        max_tokens_per_batch: int | Literal["auto"] | None = None,
        memory_check: bool = True,
        share_prompt: bool = False,
        packing_probe: bool = True,
        **kw,
    ) -> None:
        self._budget = TrainerBudget(max_tokens_per_batch, memory_check=validate_flag("memory_check", memory_check),
                                     sequence_parallel_size=1)  # fmt: skip
        self.share_prompt = validate_flag("share_prompt", share_prompt)
        packing_probe = validate_flag("packing_probe", packing_probe)
        args = args if args is not None else DPOConfig(output_dir="packing-dpo")
        _refuse_options(args, max_tokens_per_batch)
        if ref_model is None and not isinstance(model, str) and not _loadable(model) and not _adapter_reference(model, kw, args):
            ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if data_collator is None:
            data_collator = PreferenceCollator(
                max_length=args.max_length, truncation_mode=args.truncation_mode, share_prompt=self.share_prompt
            )
        self._loss = PreferenceLoss.from_config(args)
        self._heads = CheckedHeads("PackingDPOTrainer")
        _enable(model, ref_model)  # before TRL's __init__, which may compute the reference's log-probabilities
        super().__init__(model, ref_model, args, data_collator, *a, **kw)
        if self._is_vision_dataset:
            raise ValueError(
                "PackingDPOTrainer does not pack vision-language preference pairs (each pair's images would have to "
                "follow it into the packed row); train them with DPOTrainer."
            )
        _prepare(self)
        from ._checks import PreferenceCheckCallback

        self.add_callback(PreferenceCheckCallback(self, probe=packing_probe))

    def _head(self, model):
        """The model's output head, checked once (``loss.CheckedHeads``); None: its own full logits."""
        return self._heads(model)

    @property
    def max_tokens_per_batch(self) -> int | Literal["auto"] | None:
        """The budget as given (``max_tokens_per_batch=``)."""
        return self._budget.max_tokens_per_batch

    def get_train_dataloader(self):
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        from ._loader import pair_budget_loader

        return pair_budget_loader(self, self.train_dataset, self._budget)

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """The Trainer's micro-batches of one optimizer step; under a token budget their pairs are counted over the
        step and every rank, so that each pair weighs the same however the budget grouped them (``_compute_loss``)."""
        batch_samples, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.max_tokens_per_batch is not None and batch_samples:
            counts = torch.tensor([sum(int(b[key]) for b in batch_samples) for key in (PAIR_COUNT, PAIR_CHOSEN_TARGETS)],
                                  device=self.accelerator.device)  # fmt: skip
            self._step_pairs, self._step_chosen_targets = (int(n) for n in self.accelerator.gather(counts[None]).sum(0))
        return batch_samples, num_items

    def _sft_scale(self, inputs) -> float | None:
        """Under a token budget, what turns "sft"'s sum over the micro-batch's chosen targets into its share of the
        step's token mean (TRL's "sft" with the step's pairs in one batch), once ``_pair_weight`` has scaled it;
        None: the micro-batch's own mean, as TRL's."""
        targets = getattr(self, "_step_chosen_targets", None)
        if self.max_tokens_per_batch is None or not self.model.training or not targets:
            return None
        return self._step_pairs / (int(inputs["pair_count"]) * targets)

    def _pair_weight(self, inputs) -> float:
        """What the micro-batch's mean loss is scaled by so that, after the Trainer divides it by the accumulation
        steps and DDP averages the ranks, every pair of the step weighs 1 / (the step's pairs): a token budget
        changes the speed, never the gradient. 1 with a fixed number of pairs per micro-batch (TRL's)."""
        total = getattr(self, "_step_pairs", None)
        if self.max_tokens_per_batch is None or not self.model.training or not total:
            return 1.0
        steps = self.current_gradient_accumulation_steps * self.accelerator.num_processes
        return int(inputs["pair_count"]) * steps / total

    def compute_ref_log_probs(self, model, inputs):
        """(chosen, rejected) reference log-probabilities of a packed batch (``precompute_ref_log_probs``), as TRL's:
        from the model TRL gives (its reference, else the policy before its first step), under the training autocast
        (the policy is not prepared yet, so its forward has none of its own), LD-DPO's weighting applied."""
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
            self.accelerator.autocast(),
        ):
            ref = _reference(self, self._with_mask(inputs), model)
        return _with_ld_alpha(ref, self.ld_alpha)

    def _compute_loss(self, model, inputs, return_outputs):
        mode = "train" if self.model.training else "eval"
        inputs = self._with_mask(inputs)
        routed = {**inputs, "output_router_logits": True} if self.aux_loss_enabled else inputs
        policy = pair_log_probs(model, routed, self._head(model), stats=True)
        if self.precompute_ref_logps:
            ref_chosen, ref_rejected = inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]
        else:
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                ref = _reference(self, inputs)
            ref_chosen, ref_rejected = ref.chosen, ref.rejected
        chosen, rejected = _with_ld_alpha(policy, self.ld_alpha)
        if not self.precompute_ref_logps and self.ld_alpha is not None:
            ref_chosen, ref_rejected = _with_ld_alpha(ref, self.ld_alpha)
        values = _pair_values(policy, inputs["pair_completion_tokens"], chosen, rejected, ref_chosen, ref_rejected,
                              self._sft_scale(inputs))  # fmt: skip
        if self.use_weighting:
            values.weights = _wpo_weights(policy)
        loss = self._loss(values) * self._pair_weight(inputs)
        aux = _aux_loss(self, policy)
        if aux is not None:
            loss = loss + self.router_aux_loss_coef * aux
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux.detach()).mean().item())
        from ._metrics import log_pair_metrics

        log_pair_metrics(self, mode, inputs, policy, values)
        if return_outputs:
            return loss, {"chosen_logps": chosen.detach(), "rejected_logps": rejected.detach()}
        return loss

    def _with_mask(self, inputs: dict) -> dict:
        """A shared-prompt batch under sdpa/eager: the dense mask of its layout, windowed where the model's layers
        slide a window (``models/_shared_mask.py``)."""
        from .._compat import attn_implementation
        from .._model_unwrap import text_config
        from ..models import with_shared_mask

        model = unwrap_model(self.model)
        config = text_config(model)
        return with_shared_mask(inputs, attn_implementation(config), next(model.parameters()).dtype, config)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys: list[str] | None = None):
        from .._compat import prepared_inputs

        inputs = prepared_inputs(self, inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, return_outputs=False)
        return loss.detach(), None, None


def _adapter_reference(model, kwargs: dict, args) -> bool:
    """Whether TRL takes the reference from the policy itself: a PEFT adapter, or precomputed log-probabilities."""
    from accelerate.utils import is_peft_model

    return is_peft_model(model) or kwargs.get("peft_config") is not None or bool(args.precompute_ref_log_probs)


def _enable(*models) -> None:
    """enable_packing on each model given (hybrids keep the row's sequences apart)."""
    from ..models import enable_packing

    for model in models:
        if model is not None and not isinstance(model, str):
            enable_packing(model)


def _prepare(trainer) -> None:
    """enable_packing on the policy and the reference (hybrids), and the policy's packed attention for both."""
    from ..attention import choose_attention
    from ..models import enable_packing

    enable_packing(trainer.model)
    implementation = choose_attention(trainer.model, "auto")
    if trainer.share_prompt:
        from .._compat import attn_implementation
        from .._model_unwrap import text_config
        from ..models import SHARED_ATTENTION

        implementation = attn_implementation(text_config(unwrap_model(trainer.model)))
        if trainer.aux_loss_enabled:
            raise ValueError(
                f"share_prompt=True with the router's auxiliary loss (router_aux_loss_coef={trainer.router_aux_loss_coef}): "
                "the shared row routes each prompt's tokens once, where TRL's padded batch routes them with each of "
                "its two sequences, so the load-balancing loss would differ from TRL's. Pass share_prompt=False, or "
                "DPOConfig(router_aux_loss_coef=0.0) to train without the auxiliary loss."
            )
        if implementation not in SHARED_ATTENTION:
            raise ValueError(
                f"share_prompt=True needs an attention that reads a shared prompt's layout ({', '.join(SHARED_ATTENTION)}); "
                f"the model runs {implementation!r}, which would let each rejected completion see its chosen one. Pass "
                "attn_implementation='packing_fa4' (register_fa4_attention()) or 'packing_varlen', or share_prompt=False."
            )
    if trainer.ref_model is not None:
        reference = unwrap_model(trainer.ref_model)
        enable_packing(reference)
        if implementation and hasattr(reference, "set_attn_implementation"):
            reference.set_attn_implementation(implementation)


def _reference(trainer, inputs, model=None) -> PairLogProbs:
    """The reference model's log-probabilities (a PEFT policy with its adapter off, or the "ref" adapter; with
    ``precompute_ref_log_probs`` and no reference model, the policy itself before its first step, as TRL's).
    ``model``: the one to run where the caller has it (TRL's precompute: a DeepSpeed engine under ZeRO-3)."""
    if model is None:
        model = trainer.model if trainer.ref_model is None else trainer.ref_model
    if trainer.ref_model is None:
        from accelerate.utils import is_peft_model

        inner = trainer.accelerator.unwrap_model(model)
        if is_peft_model(inner):
            with use_adapter(inner, adapter_name="ref" if "ref" in inner.peft_config else None):
                return pair_log_probs(model, inputs, trainer._head(model))
    return pair_log_probs(model, inputs, trainer._head(model))


def _with_ld_alpha(logps: PairLogProbs, ld_alpha) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected): each completion's log-probability; with ``ld_alpha``, the tokens past the shorter
    completion of its pair weighted by it (LD-DPO)."""
    if ld_alpha is None:
        return logps.chosen, logps.rejected
    lengths = logps.target_counts()
    shared = torch.minimum(lengths[0::2], lengths[1::2]).repeat_interleave(2)
    tail = (logps.sequence >= 0) & (logps.positions() > shared[logps.sequence.clamp(min=0)])
    weight = torch.where(tail, torch.full_like(logps.per_token, ld_alpha), torch.ones_like(logps.per_token))
    sums = logps.weighted_sums(weight)
    return sums[0::2], sums[1::2]


def _pair_values(policy: PairLogProbs, completion_tokens, chosen, rejected, ref_chosen, ref_rejected,
                 sft_scale: float | None = None) -> PairValues:  # fmt: skip
    """What the losses read; the completion lengths ``ipo`` and ``sigmoid_norm`` divide by are TRL's
    ``completion_mask.sum()``: every completion token, a first token of its sequence too (never a target).
    ``sft_scale``: "sft" as the sum over the chosen targets times it (a token budget's share of the step's mean)."""
    lengths = torch.as_tensor(completion_tokens, device=chosen.device)
    chosen_targets = (policy.sequence >= 0) & (policy.sequence % 2 == 0)
    picked = policy.per_token[chosen_targets]
    sft = -picked.mean() if sft_scale is None else -picked.sum() * sft_scale
    ref_chosen, ref_rejected = (torch.as_tensor(r, device=chosen.device).to(chosen.dtype) for r in (ref_chosen, ref_rejected))
    return PairValues(chosen, rejected, ref_chosen, ref_rejected, lengths[0::2], lengths[1::2], sft)


def _wpo_weights(policy: PairLogProbs) -> torch.Tensor:
    """(B,) each pair's WPO weight (``use_weighting``, Eq. 2 of the WPO paper, as TRL's): for each completion
    ``exp(mean over its targets of log p - log sum_v p_v**2)``, the pair's the product of its two; no gradient."""
    with torch.no_grad():
        aligned = policy.per_sequence(policy.per_token - policy.stats["log_sum_sq_probs"].to(policy.per_token.device))
        weights = torch.exp(aligned / policy.target_counts().clamp(min=1))
    return weights[0::2] * weights[1::2]


def _aux_loss(trainer, policy: PairLogProbs):
    if not trainer.aux_loss_enabled:
        return None
    outputs = policy.outputs
    aux = outputs.get("aux_loss") if isinstance(outputs, dict) else getattr(outputs, "aux_loss", None)
    return aux
