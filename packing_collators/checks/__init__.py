"""The checks that keep packed examples apart: refuse, before training, what would mix them.

_model_checks.py       check_model: forward signature, use_cache, rope, what the attention lacks
_batch_checks.py       check_batch: a collated batch's packed layout against the attention
_collated_features.py  check_collated_features: the collator keeps the dataset's examples apart
_probe.py              probe_packing: measured on the model itself (packed vs alone, and a leak test)
_probe_experts.py      tokenwise_experts: routed experts one token at a time in the probes (no rounding by batch)
_probe_refusal.py      refuse_failed_probe: a failed probe's numbers, the cause they point to and the fix
_probe_parts.py        what both probes share (this one and parallel's): lengths, tokens, logits, tolerance
_support.py            check_packing_support: the static checks, then the probe
_shared_layout.py      refuse_shared_layout_change: a shared-prompt layout measured on a model, its verdict
_token_range.py        check_training_data: something to train on, every token id inside the embedding

Built on ``attention/`` (how an implementation keeps examples apart); ``parallel/`` and
``trainer/`` build on it.
"""

from ._batch_checks import check_batch
from ._collated_features import check_collated_features
from ._model_checks import check_model
from ._probe import ProbeReport, probe_packing
from ._probe_experts import tokenwise_experts
from ._probe_parts import PROBE_LENGTHS, model_inputs, output_logits, probe_dtype, synthetic_tokens, tolerance
from ._probe_refusal import refuse_failed_probe
from ._shared_layout import refuse_shared_layout_change
from ._support import check_packing_support
from ._token_range import check_training_data, refuse_no_batches, refuse_no_examples

__all__ = [
    "PROBE_LENGTHS",
    "ProbeReport",
    "check_batch",
    "check_collated_features",
    "check_model",
    "check_packing_support",
    "check_training_data",
    "model_inputs",
    "output_logits",
    "probe_dtype",
    "probe_packing",
    "refuse_failed_probe",
    "refuse_shared_layout_change",
    "refuse_no_batches",
    "refuse_no_examples",
    "synthetic_tokens",
    "tokenwise_experts",
    "tolerance",
]
