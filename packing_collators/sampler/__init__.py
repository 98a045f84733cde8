"""The multipack sampler: token-budget micro-batches for a DataLoader, equal across ranks.

    _dataset_lengths.py  lengths_from_dataset, example_lengths: token counts read from a dataset (once)
    _options.py          SamplerOptions: the sampler's settings, one frozen object checked once
    _epoch_plan.py       plan_epoch: one epoch's batches for every rank (numpy only, no torch)
    _batch_sampler.py    MultipackBatchSampler: the plan as a torch batch sampler, resumable
    _rank_agreement.py   check_ranks_agree: every rank built the sampler from the same inputs
    _cost_model.py       fit_attention_weight: the balancing cost model fitted from measured batch times

``MultipackBatchSampler`` loads on first use (it subclasses torch's Sampler), so planning
and the command line stay free of torch.
"""

from .._lazy import lazy_names
from ._cost_model import CostFit, fit_attention_weight
from ._dataset_lengths import example_lengths, lengths_from_dataset
from ._epoch_plan import EpochPlan, check_overflow, plan_epoch
from ._options import SAMPLER_OVERFLOW, Balance, SamplerOptions, check_sampler_option

__all__ = [
    "Balance",
    "CostFit",
    "EpochPlan",
    "MultipackBatchSampler",
    "SamplerOptions",
    "SAMPLER_OVERFLOW",
    "check_overflow",
    "check_sampler_option",
    "example_lengths",
    "fit_attention_weight",
    "lengths_from_dataset",
    "plan_epoch",
]


__getattr__ = lazy_names(__name__, {"MultipackBatchSampler": "._batch_sampler"})  # it subclasses torch's Sampler
