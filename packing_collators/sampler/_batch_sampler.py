"""A DataLoader batch sampler that packs example indices into token-budget micro-batches.

The dataset is not rewritten: each epoch, :func:`plan_epoch` shuffles the indices,
packs them into bins of at most ``max_tokens_per_batch`` tokens with the packing
engine, pads or drops the last round so every rank gets the same number of batches,
and deals the bins to ranks so each step's work is balanced. This rank's batches are
then yielded as lists of dataset indices, for a collator that flattens each one::

    DataLoader(dataset, batch_sampler=MultipackBatchSampler(lengths, 16384),
               collate_fn=FlatteningCollator())

Cost: planning is numpy plus one engine call per group (timed against torch's and
transformers' samplers in docs/benchmarks.md). The plan of the current epoch is cached,
so ``len()``, iteration and ``stats()`` plan it once. Under ``torch.distributed``,
construction adds one ``all_gather_object`` of a ~200-byte fingerprint, so every rank
refuses a rank built from another dataset (``_rank_agreement.py``) instead of hanging.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, fields
from operator import attrgetter

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler

from .._validation import validate_lengths, validate_positive_int
from ..engine import Overflow, Strategy
from ._epoch_plan import EpochPlan, check_overflow, plan_with_options
from ._options import Balance, SamplerOptions
from ._rank_agreement import check_ranks_agree, fingerprint

__all__ = ["MultipackBatchSampler"]

_STATE_VERSION = 1


# Left out of the fingerprint: num_replicas is the exchange's own condition (it runs only when the world
# size equals it), progress changes nothing in the plan.
_NOT_FINGERPRINTED = ("num_replicas", "progress")


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def _world_size(num_replicas: int | None) -> int:
    """``num_replicas``, from ``torch.distributed`` when not given (1 without it); :class:`SamplerOptions` checks it."""
    if num_replicas is not None:
        return num_replicas
    return dist.get_world_size() if _initialised() else 1


def _this_rank(rank: int | None, num_replicas: int) -> int:
    """``rank``, from ``torch.distributed`` when not given (0 without it), checked against ``num_replicas``."""
    if rank is None:
        rank = dist.get_rank() if _initialised() else 0
    rank = validate_positive_int("rank", rank, minimum=0)
    if rank >= num_replicas:
        raise ValueError(f"rank={rank} is out of range for num_replicas={num_replicas}; use 0 <= rank < num_replicas.")
    return rank


def _options_as_attributes(cls):
    """Each :class:`SamplerOptions` field as a read-only attribute: ``sampler.seed`` is ``sampler.options.seed``."""
    for field in fields(SamplerOptions):
        doc = f"``options.{field.name}`` (read-only: the options are checked once, at construction)."
        setattr(cls, field.name, property(attrgetter(f"options.{field.name}"), doc=doc))
    return cls


@_options_as_attributes
class MultipackBatchSampler(Sampler[list[int]]):
    """Token-budget micro-batches of dataset indices, the same number on every rank.

    Args:
        lengths: tokens of each example (list, numpy array or tensor; see
            :func:`lengths_from_dataset` to read them from a ``datasets.Dataset``).
        max_tokens_per_batch: the most tokens a batch may hold.
        strategy: the engine's packing strategy: ``"bfd"`` (default), ``"ffd"`` or ``"next_fit"``.
        shuffle: shuffle examples, bins and steps each epoch (seeded by ``seed`` and the epoch).
            With ``False`` the examples are packed in dataset order and the steps run
            from the costliest down (an out-of-memory shows at the first step).
        seed: seed of the shuffle; it must be the same on every rank.
        num_replicas, rank: ranks and this rank; by default from ``torch.distributed``
            when it is initialised, else 1 and 0.
        drop_last: ``False`` (default) pads the last round with batches of examples repeated
            from the epoch (counted in ``stats()["repeated_examples"]``); ``True`` drops the
            bins with the fewest tokens instead (counted in ``stats()["drop_last_examples"]``).
        group_size: pack the shuffled examples in groups of about this many (each group on
            its own: more variety within a batch, slightly lower efficiency, one engine call
            per group). ``None`` (default) packs the whole epoch as one group.
        balance: cost that decides which rank gets which bin: ``"cost"`` (default:
            ``tokens + attention_weight * sum(length**2)``), ``"tokens"``, ``"attention"``
            (sum of squared lengths) or ``"none"`` (bins in shuffled order).
        attention_weight: the weight of attention in ``"cost"`` (and in ``stats()``'s
            ``imbalance`` and ``step_imbalance``): the seconds of attention per squared token
            relative to the seconds per token, ``per_attention / per_token``. ``None``
            (default) is ``1 / max_tokens_per_batch`` (an example filling the budget costs
            twice its tokens). When ranks still wait on each other, measure batches' times
            and pass :func:`fit_attention_weight`'s ``attention_weight``; ``0`` is tokens only.
        overflow: an example longer than ``max_tokens_per_batch``: ``"error"`` (default,
            raised at construction, naming it) or ``"drop"`` (left out every epoch, counted
            in ``stats()["overflow_dropped_examples"]``). There is no ``"truncate"``: a
            sampler chooses indices and cannot cut tokens; truncate when tokenizing.
        check_ranks: under ``torch.distributed`` with ``num_replicas`` ranks, exchange a
            fingerprint of the inputs at construction and refuse ranks that differ (default).
            That is a collective: every rank must build its sampler. Pass False for a sampler
            built on one rank only (e.g. to read another rank's plan or its statistics).
        progress: a progress bar (stderr) while an epoch is planned: ``None`` (default) for
            4,000,000+ examples unless ``datasets`` or ``transformers`` has progress bars off
            (``datasets.disable_progress_bars()``, ``transformers.utils.logging.disable_progress_bar()``),
            ``True`` always, ``False`` never. ``None`` shows it on rank 0 only. It changes
            nothing in the plan.

    The settings are checked once, at construction, into one frozen :class:`SamplerOptions`,
    ``sampler.options`` (``num_replicas`` resolved); each also reads as a read-only attribute
    (``sampler.seed``). A bad one raises there, naming it.

    Zero-length examples are never batched (the collator would refuse them); they are
    counted in ``stats()["empty_examples"]``. No examples (or only empty ones) is not an
    error: the sampler yields no batch, and warns at construction that it will not.

    ``len(sampler)`` is the number of batches the next iteration yields on this rank
    (after :meth:`load_state_dict`, the batches still to come in that epoch);
    ``stats()["batches_per_epoch"]`` is the whole epoch's. It can differ by a few batches
    from one epoch to the next. Call :meth:`set_epoch` before each epoch, as with
    ``DistributedSampler``, or every epoch repeats the same order.

    Under ``torch.distributed``, when the sampler's ranks are the process group's, every
    rank must build the sampler from the same lengths and settings (it shards them
    itself): construction is one collective that swaps a fingerprint of them, and every
    rank raises a ``ValueError`` naming the ranks that differ from rank 0 (a rank given
    another dataset would plan another number of steps, and training would hang).

    >>> lengths = [5, 2, 4, 1, 3, 6, 7, 2]
    >>> sampler = MultipackBatchSampler(lengths, max_tokens_per_batch=8)
    >>> list(sampler), len(sampler)
    ([[5, 1], [3, 6], [2, 7], [4, 0]], 4)
    >>> sampler.set_epoch(1)
    >>> list(sampler)
    [[7, 2], [3, 6], [1, 5], [0, 4]]

    Three ranks: 4 bins, so 2 more are made of repeated examples (``[6]``, ``[2, 4, 3]``):

    >>> [list(MultipackBatchSampler(lengths, 8, num_replicas=3, rank=r)) for r in range(3)]
    [[[3, 6], [2, 7]], [[6], [2, 4, 3]], [[5, 1], [4, 0]]]

    The same settings for another rank, from ``options``:

    >>> from dataclasses import asdict
    >>> first = MultipackBatchSampler(lengths, 8, num_replicas=3, rank=0)
    >>> first.options.num_replicas, first.balance
    (3, 'cost')
    >>> list(MultipackBatchSampler(lengths, **asdict(first.options), rank=1))
    [[6], [2, 4, 3]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        max_tokens_per_batch: int,
        *,
        strategy: Strategy = "bfd",
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        group_size: int | None = None,
        balance: Balance = "cost",
        attention_weight: float | None = None,
        overflow: Overflow = "error",
        check_ranks: bool = True,
        progress: bool | None = None,
    ) -> None:
        super().__init__()
        self._options = SamplerOptions(
            max_tokens_per_batch=max_tokens_per_batch, seed=seed, strategy=strategy, shuffle=shuffle,
            drop_last=drop_last, group_size=group_size, balance=balance, attention_weight=attention_weight,
            overflow=overflow, num_replicas=_world_size(num_replicas), progress=progress,
        )  # fmt: skip
        self.rank = _this_rank(rank, self.options.num_replicas)
        self.lengths = validate_lengths(np.asarray(lengths))
        if check_ranks:  # a collective: every rank of the group must build its sampler
            check_ranks_agree(self._fingerprint(), num_replicas=self.options.num_replicas, rank=self.rank)
        # after the exchange: with another dataset, one rank alone could raise it and leave the others waiting
        check_overflow(self.lengths, self.options.max_tokens_per_batch, self.options.overflow)
        if not np.any(self.lengths > 0):
            warnings.warn(
                f"MultipackBatchSampler got {len(self.lengths)} examples with tokens in none of them, so it yields no "
                "batch; training on it would run no step (PackingTrainer and PackingCheckCallback refuse that).",
                stacklevel=2,
            )
        self.epoch = 0
        self._start = 0  # batches to skip at the next iteration (resuming mid-epoch)
        self._yielded = 0  # batches of this epoch handed out so far
        self._plan: EpochPlan | None = None

    @property
    def options(self) -> SamplerOptions:
        """The settings, checked at construction (frozen: build a new sampler to change them)."""
        return self._options

    def _fingerprint(self) -> dict:
        """Everything that decides the plan, except the ranks and epoch (see :func:`fingerprint`)."""
        settings = {name: value for name, value in asdict(self.options).items() if name not in _NOT_FINGERPRINTED}
        return fingerprint(self.lengths, **settings)

    def __repr__(self) -> str:
        settings = ", ".join(f"{name}={value!r}" for name, value in asdict(self.options).items())
        return f"MultipackBatchSampler({len(self.lengths)} examples, {settings}, rank={self.rank}, epoch={self.epoch})"

    def plan(self) -> EpochPlan:
        """This epoch's plan for every rank (computed once per epoch, then cached)."""
        if self._plan is None:
            self._plan = plan_with_options(self.lengths, self.options, epoch=self.epoch, rank=self.rank)
        return self._plan

    def __len__(self) -> int:
        return self.plan().num_steps - self._start

    def __iter__(self) -> Iterator[list[int]]:
        plan = self.plan()
        start = self._start
        self._yielded = start
        for step in range(start, plan.num_steps):
            batch = plan.batch(step, self.rank)
            self._yielded = step + 1
            yield batch
        self._start = 0  # a finished epoch, iterated again, starts from its beginning

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s plan from now on (a new epoch starts from its first batch).

        Setting the epoch that :meth:`load_state_dict` restored keeps its resume point, so
        a training loop that calls ``set_epoch`` at the start of every epoch resumes right.
        """
        epoch = validate_positive_int("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self.epoch, self._start, self._yielded, self._plan = epoch, 0, 0, None

    def stats(self) -> dict:
        """This epoch's statistics as a plain dict (see :meth:`EpochPlan.stats`), plus ``epoch``.

        >>> stats = MultipackBatchSampler([5, 2, 4, 1, 3, 6, 7, 2], 8, num_replicas=3).stats()
        >>> stats["batches_per_epoch"], round(stats["efficiency"], 4), stats["padded_batches"], stats["repeated_examples"]
        (2, 0.9375, 2, 4)
        """
        stats = self.plan().stats()
        return type(stats)({"epoch": self.epoch, **stats})

    def state_dict(self) -> dict:
        """Where this rank is: the epoch and how many of its batches were handed out.

        Every rank yields the same number of batches, so rank 0's state resumes every
        rank. A DataLoader prefetches, so the count can run ahead of the batches trained
        on; a training loop that knows its step in the epoch can pass
        ``{**state, "batches_yielded": step}`` to :meth:`load_state_dict` instead.

        >>> sampler = MultipackBatchSampler([5, 2, 4, 1, 3, 6, 7, 2], 8)
        >>> batches = iter(sampler); first = next(batches)
        >>> state = sampler.state_dict(); state["epoch"], state["batches_yielded"]
        (0, 1)
        >>> resumed = MultipackBatchSampler([5, 2, 4, 1, 3, 6, 7, 2], 8)
        >>> resumed.load_state_dict(state)
        >>> len(resumed), list(resumed) == list(batches)
        (3, True)
        """
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "batches_yielded": self._yielded,
            "seed": self.options.seed,
            "num_replicas": self.options.num_replicas,
            "max_tokens_per_batch": self.options.max_tokens_per_batch,
            "num_examples": len(self.lengths),
            "attention_weight": self.options.attention_weight,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration yields epoch ``state["epoch"]`` from batch ``state["batches_yielded"]``."""
        mine = self.state_dict()
        for key in ("seed", "num_replicas", "max_tokens_per_batch", "num_examples", "attention_weight"):
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"The state was saved with {key}={state[key]!r} but this sampler has {key}={mine[key]!r}; "
                    "the epoch's plan would differ. Build the sampler with the same settings to resume."
                )
        self.set_epoch(state["epoch"])
        done = validate_positive_int("batches_yielded", state["batches_yielded"], minimum=0)
        total = self.plan().num_steps
        if done > total:
            raise ValueError(
                f"The state says {done} batches were yielded in epoch {self.epoch}, but it has only {total} "
                "on this rank; it was saved for a different dataset or settings."
            )
        self._start = self._yielded = done
