"""The per-token log-probabilities TRL's RL losses read, from one packed row per micro-batch.

    TRL: _get_per_token_logps_and_entropies(model, input_ids (B, P + C), attention_mask, C, batch_size, ...)
      each chunk of ``batch_size`` rows (TRL's own chunks)  -> in one order for its rows, a prompt's together
                                                               (row_order: TRL shuffles them between passes)
        -> padded_rows: its sequences
        -> flat_sequences_batch (each whole) or shared_prompt_batch (each prompt once for its group)
        -> loss.log_prob_forward: the chunked head at TRL's temperature, entropies, no logits
        -> scatter: (B, C) log-probabilities and entropies where TRL's fused head puts them (0 on padding)
      the MoE aux loss: the mean over the chunks, as TRL's

Entropies carry gradients where TRL's entropy bonus reads them (``entropy_coef``, ``use_adaptive_entropy``), and
are tied where TRL's padded forward ties them (``first_same_context``). Everything after (old-policy ratios, the
reference's KL, every loss type, entropy masks, the metrics) is TRL's code on the same numbers. Cost: one forward
per chunk on its real tokens only; with ``share_prompt`` each prompt's tokens once instead of once per completion
(Gated DeltaNet and KDA on fla's kernels too, from its final state; other stateful layers recompute them per
completion).
"""

from __future__ import annotations

import torch

from .._compat import attn_implementation
from .._model_unwrap import text_config, unwrap_model
from ..batch import KEYS_LABELS, KV_INDEX, SEQUENCE_KEYS, shifted_targets
from ..collate import flat_sequences_batch, shared_prompt_batch
from ..loss import log_prob_forward
from ..models import with_shared_mask
from ._rows import first_same_context, padded_rows, row_order

__all__ = ["MULTIMODAL_INPUTS", "PackedLogProbs"]

MULTIMODAL_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                     "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")  # fmt: skip


class PackedLogProbs:
    """Mixed into a TRL RL trainer (GRPO, RLOO): its ``_get_per_token_logps_and_entropies`` on packed rows.

    The trainer sets ``share_prompt`` and ``temperature`` (TRL's), and keeps ``_heads`` (``loss.CheckedHeads``)."""

    share_prompt: bool = False

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, *, rows_as_given=False,
                                           **multimodal):  # fmt: skip
        """TRL's method on packed rows; ``rows_as_given``: lay the rows in the order they come instead of sorting them
        (the shared layout's check, which changes one row and must find the others where they were)."""
        given = sorted(name for name, value in multimodal.items() if value is not None)
        if given:
            raise ValueError(
                f"{type(self).__name__} does not pack vision-language batches (their {', '.join(given)} would have to "
                f"follow each sequence into the packed row); train them with TRL's own trainer."
            )
        batch_size = batch_size or input_ids.size(0)  # TRL's chunks: the same rows per forward
        found = [self._packed_chunk(model, input_ids[s : s + batch_size], attention_mask[s : s + batch_size],
                                    logits_to_keep, compute_entropy, compute_aux_loss, rows_as_given)
                 for s in range(0, input_ids.size(0), batch_size)]  # fmt: skip
        logps = torch.cat([f[0] for f in found])
        entropies = None
        if compute_entropy:  # each token's entropy as TRL's padded forward ties it (_rows.first_same_context)
            entropies = torch.cat([f[1] for f in found])
            entropies = entropies.gather(0, first_same_context(input_ids, attention_mask, logits_to_keep))
        aux = torch.stack([f[2] for f in found]).mean() if compute_aux_loss else None
        return logps, entropies, aux

    def _packed_chunk(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy, compute_aux_loss,
                      rows_as_given=False):  # fmt: skip
        order = None if rows_as_given else row_order(input_ids, attention_mask, logits_to_keep)
        if order is not None:  # the rows as TRL's shuffle left them: in one order, the values put back in TRL's
            inverse = torch.argsort(order)
            logps, entropies, aux = self._packed_chunk(model, input_ids[order], attention_mask[order], logits_to_keep,
                                                       compute_entropy, compute_aux_loss, rows_as_given=True)  # fmt: skip
            return logps[inverse], entropies[inverse] if entropies is not None else None, aux
        rows = padded_rows(input_ids, attention_mask, logits_to_keep)
        groups = rows.groups(self.share_prompt)
        shared = any(len(group) > 1 for group in groups)
        batch = shared_prompt_batch(groups) if shared else flat_sequences_batch(rows.sequences)
        device = input_ids.device
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items() if k not in SEQUENCE_KEYS or k == KEYS_LABELS}
        targets = shifted_targets({"labels": batch.pop(KEYS_LABELS) if shared else batch.pop("labels")})
        keys_rows = batch[KV_INDEX].reshape(targets.shape) if shared else None
        if shared:
            inner = unwrap_model(model)
            config = text_config(inner)
            batch = with_shared_mask(batch, attn_implementation(config), next(inner.parameters()).dtype, config)
        if compute_aux_loss:
            batch["output_router_logits"] = True
        stats: dict | None = {} if compute_entropy else None
        entropy_grad = compute_entropy and torch.is_grad_enabled() and getattr(self, "_entropy_bonus_enabled", False)
        per_token, outputs = log_prob_forward(model, batch, self._heads(model), targets, stats=stats, rows=keys_rows,
                                              temperature=self.temperature, entropy_grad=entropy_grad)  # fmt: skip
        logps = rows.scatter(per_token, targets)
        # a chunk whose completions are all masked (truncated, mask_truncated_completions) has no target: zeros
        entropies = rows.scatter(stats.get("entropy", torch.zeros_like(per_token)), targets) if compute_entropy else None
        aux = None
        if compute_aux_loss:
            aux = outputs.get("aux_loss") if isinstance(outputs, dict) else getattr(outputs, "aux_loss", None)
        return logps, entropies, aux
