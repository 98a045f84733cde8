"""What a refused model is told: the probe's numbers, the cause they point to, and the fix.

    routed experts beyond rounding   the experts module by name; train padded
    a leak within rounding           batch-composition rounding the probe cannot run per token, or a faint leak
    a leak                           the first layer that moved: attention (the implementation's fix), or a
                                     layer kind enable_packing does not know (train padded)
    packed != alone                  positions numbered from another start, or an input the batch lacks

Cost: string formatting, once, on a failed probe.
"""

from __future__ import annotations

from ._probe import ProbeReport

__all__ = ["refuse_failed_probe"]


def refuse_failed_probe(report: ProbeReport, kind: str) -> None:
    """Raise a ValueError with what the probe measured and the fix, unless it passed.

    ``kind`` is how the implementation keeps examples apart (``"cu_seq_lens"``,
    ``"position_ids"`` or ``"unknown"``); it picks the fix.
    """
    if report.passed:
        return
    text = f"Packing would change this model's outputs, so it is refused ({report.summary()}). "
    if report.experts_mix_tokens:
        text += (
            f"Its routed experts compute a token differently when other tokens run beside it: {report.experts_worst} "
            f"run on the whole row and on each token alone differ by {report.experts_rounding:.3g}, more than "
            f"rounding (tolerance {report.experts_tolerance:.3g}), so each example's outputs depend on the others "
            "in its row. Train this model padded."
        )
    elif report.leak and report.leak <= report.tolerance:
        where = f" (the first layer whose output moved: {report.culprit})" if report.culprit else ""
        text += (
            f"Changing one example's tokens moved the other examples' logits by {report.leak:.3g}{where}, within "
            f"rounding (tolerance {report.tolerance:.3g}): a layer whose arithmetic depends on which tokens share "
            "the batch (routed experts, or mixture-of-attention heads as in JetMoE, that the probe cannot run one "
            "token at a time) moves them this much without any example seeing another, and so would a faint leak; "
            "the probe cannot tell the two apart. Check the packed loss against padding, and pass probe=False "
            "if it matches."
        )
    elif report.leak:
        where = f"; the first layer whose output moved: {report.culprit}" if report.culprit else ""
        text += (
            f"Changing one example's tokens moved the other examples' logits by {report.leak:.3g}: the examples "
            f"attend to each other{where}. "
        )
        if report.prepared and not report.culprit_attention:
            text += (
                "enable_packing(model) prepared this model, and that layer still mixes the examples: it carries "
                "state in a way enable_packing does not recognise (a layer kind it does not know). Train this "
                "model padded."
            )
        elif kind == "cu_seq_lens":
            text += (
                f"{report.implementation!r} keeps examples apart only with cu_seq_lens_q/k in a one-row batch; "
                "several rows without them (e.g. PrePackedCollator(mode='pad')) mix the examples of a row. "
                "Collate with FlatteningCollator or PrePackedCollator(mode='flatten')."
            )
        else:
            text += (
                f"{report.model}'s {report.implementation!r} attention does not keep the examples apart: it does not "
                "build its mask from the packed position_ids, or its attention function ignores that mask (e.g. OPT, "
                "or BERT/RoBERTa-style models, which are bidirectional or ignore them). "
                "Use an implementation that reads cu_seq_lens if the model supports one (attn_implementation="
                "'flash_attention_2'/'flash_attention_4', or 'packing_varlen' after register_varlen_attention()), "
                "or train this model padded."
            )
    else:
        text += (
            f"No example sees another, but each example's logits packed differ from the example run alone by "
            f"{report.max_difference:.3g} (tolerance {report.tolerance:.3g}): the model numbers positions from "
            "another start (RoBERTa-style models start at padding_idx + 1: FlatteningCollator(position_ids_start="
            "...)) or reads an input the packed batch lacks."
        )
    raise ValueError(text + " Pass probe=False only after checking the packed loss against padding yourself.")
