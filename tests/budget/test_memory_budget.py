"""The token budget from GPU memory: the arithmetic (any machine) and the refusals (the dry runs need a GPU).

The dry runs themselves were measured on an H100 by the one-off memory_budget.py (its numbers are in
docs/benchmarks.md, "One-off investigations"); here the line through two measured peaks is checked against hand-computed budgets and properties.
"""

from __future__ import annotations

import numpy as np
import pytest
from _tiny_models import tiny_model

from packing_collators import TokenBudget, measure_token_budget
from packing_collators.budget import plan_token_budget

GIB = 1 << 30


def test_the_budget_is_the_line_through_two_peaks_within_the_memory_share():
    # base 10 GiB, 1 MiB per token, 80 GiB card at 90%, 4 GiB of optimizer states: (72 - 4 - 10) GiB / 1 MiB
    peaks = {2048: 10 * GIB + 2048 * (1 << 20), 4096: 10 * GIB + 4096 * (1 << 20)}
    budget = plan_token_budget(peaks, longest=2048, total_bytes=80 * GIB, optimizer_bytes=4 * GIB)
    assert isinstance(budget, TokenBudget)
    assert budget.max_tokens_per_batch == 58 * 1024
    assert budget.base_bytes == 10 * GIB and budget.bytes_per_token == 1 << 20


@pytest.mark.parametrize("seed", range(20))
def test_the_budget_is_a_multiple_of_64_holds_the_longest_and_fits_the_line(seed):
    rng = np.random.default_rng(seed)
    longest = int(rng.integers(64, 32768))
    base, per_token, total = rng.uniform(1, 20) * GIB, rng.uniform(1e4, 3e6), 80 * GIB
    peaks = {longest: int(base + per_token * longest), 2 * longest: int(base + per_token * 2 * longest)}
    fraction = float(rng.uniform(0.5, 0.95))
    try:
        budget = plan_token_budget(peaks, longest=longest, total_bytes=total, memory_fraction=fraction)
    except ValueError as error:
        assert f"One example of {longest} tokens does not fit" in str(error)
        assert base + per_token * longest > fraction * total - per_token  # it really does not fit
        return
    b = budget.max_tokens_per_batch
    assert (b % 64 == 0 or b == longest) and b >= longest
    assert base + per_token * b <= fraction * total + 1  # the planned peak stays within the share
    assert base + per_token * (b + 64) > fraction * total - 1  # and is not 64 tokens short of it
    try:  # a smaller share never gives a larger budget (or refuses)
        smaller = plan_token_budget(peaks, longest=longest, total_bytes=total, memory_fraction=fraction * 0.9)
        assert smaller.max_tokens_per_batch <= b
    except ValueError:
        assert base + per_token * longest > fraction * 0.9 * total - per_token


def test_an_example_that_cannot_fit_alone_is_refused_with_the_numbers_and_the_fix():
    with pytest.raises(
        ValueError,
        match=r"One example of 4096 tokens does not fit in 90% of this GPU's 80.00 GiB.*gradient checkpointing",
    ):
        plan_token_budget({4096: 74 * GIB, 8192: 78 * GIB}, longest=4096, total_bytes=80 * GIB)
    with pytest.raises(ValueError, match=r"memory_fraction must be in \(0, 1\], got 1.5"):
        plan_token_budget({1: 1, 2: 2}, longest=1, total_bytes=10, memory_fraction=1.5)


def test_two_longest_examples_that_ran_out_of_memory_give_a_budget_between_one_and_two():
    # measure_token_budget records an out-of-memory second run as the whole card: the line is then steeper
    peaks = {8192: 60 * GIB, 16384: 80 * GIB}
    budget = plan_token_budget(peaks, longest=8192, total_bytes=80 * GIB)
    assert 8192 <= budget.max_tokens_per_batch < 16384


def test_the_dry_runs_need_the_model_on_a_gpu():
    with pytest.raises(ValueError, match="move the model to a CUDA device first"):
        measure_token_budget(tiny_model("llama"), longest=128)


@pytest.mark.parametrize("seed", range(10))
def test_a_peak_above_the_line_shrinks_the_budget_until_a_measured_step_fits(seed):
    # measured on an H100: a 1B model with gradient checkpointing ran out of memory at the budget the line
    # through 8k and 16k tokens gave; the budget is now measured itself and shrunk until it fits
    from packing_collators.budget import fit_token_budget

    rng = np.random.default_rng(seed)
    longest, total = int(rng.integers(1024, 16384)), 80 * GIB
    base, linear, square = rng.uniform(1, 10) * GIB, rng.uniform(1e4, 1e6), rng.uniform(0, 0.05)
    cap = int(rng.uniform(0.5, 1.0) * total)  # above this the card runs out of memory, whatever the curve says

    def step(tokens):
        peak = base + linear * tokens + square * tokens**2
        return None if peak > cap else int(peak)

    measured = []
    try:
        budget = fit_token_budget(lambda t: measured.append(t) or step(t), longest=longest, total_bytes=total)
    except ValueError as error:
        assert f"One example of {longest} tokens does not fit" in str(error)
        assert step(longest) is None or step(longest) > 0.9 * total - linear
        return
    chosen = budget.max_tokens_per_batch
    assert chosen >= longest and step(chosen) is not None and step(chosen) <= 0.9 * total
    assert chosen in measured  # what it returns was measured to fit, not extrapolated


def test_a_ceiling_below_the_longest_example_still_holds_it_and_a_bad_one_is_refused():
    from packing_collators.budget import fit_token_budget

    line = lambda tokens: int(GIB + 1e4 * tokens)  # noqa: E731 - millions of tokens would fit
    budget = fit_token_budget(line, longest=4096, total_bytes=80 * GIB, ceiling=1000)
    assert budget.max_tokens_per_batch == budget.ceiling == 4096  # no example is cut to meet the ceiling
    assert fit_token_budget(line, longest=4096, total_bytes=80 * GIB).ceiling is None  # memory set it
    with pytest.raises(ValueError, match="ceiling must be a positive integer, got 0"):
        fit_token_budget(line, longest=4096, total_bytes=80 * GIB, ceiling=0)


def test_one_example_that_runs_out_of_memory_alone_is_refused_before_training():
    from packing_collators.budget import fit_token_budget

    with pytest.raises(
        ValueError, match=r"One example of 8192 tokens does not fit on this GPU \(80.00 GiB\).*checkpointing"
    ):
        fit_token_budget(lambda tokens: None, longest=8192, total_bytes=80 * GIB)


def test_a_longest_example_that_is_not_a_positive_length_is_refused():
    with pytest.raises(ValueError, match="longest must be a positive integer, got 0"):
        measure_token_budget(tiny_model("llama"), longest=0)
    with pytest.raises(ValueError, match="longest must be a positive integer, got -5"):
        plan_token_budget({1: 1, 2: 2}, longest=-5, total_bytes=10)


class _FakeCuda:
    """torch.cuda's memory counters on the CPU: a fixed peak, and the second forward may run out of memory."""

    def __init__(self, monkeypatch, model, *, peak: int, fail_at_forward: int | None = None):
        import torch

        self.forwards, self.states_alive = 0, []
        for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
            monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *args, **kwargs: peak)
        live = torch.empty_like

        def counting_empty_like(tensor, *args, **kwargs):  # the optimizer-state placeholders
            self.states_alive.append(self.forwards)
            return live(tensor, *args, **kwargs)

        monkeypatch.setattr(torch, "empty_like", counting_empty_like)

        def hook(module, args, kwargs):
            self.forwards += 1
            if self.forwards == fail_at_forward:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")

        model.register_forward_pre_hook(hook, with_kwargs=True)


def test_the_measured_step_is_a_second_step_with_the_optimizer_states_in_place(monkeypatch):
    # On an H100 a 1B model (gradient checkpointing) fit one forward + backward at its budget on a
    # fresh allocator, then ran out of memory at the second training step: the states, made at the
    # first step, split the blocks the next one needed. So the dry run runs two passes with them.
    from packing_collators.budget._memory_budget import _peak_bytes

    model = tiny_model()
    fake = _FakeCuda(monkeypatch, model, peak=10 * GIB)
    params = [p for p in model.parameters() if p.requires_grad]
    peak = _peak_bytes(model, 64, 32, states_per_parameter=2)
    assert fake.forwards == 2  # one pass before the states, one with them
    assert fake.states_alive == [1] * (2 * len(params))  # made between the passes, two per parameter
    assert peak == 10 * GIB - 2 * sum(p.numel() * p.element_size() for p in params)  # the caller adds them
    assert all(p.grad is None for p in model.parameters())


def test_a_second_step_that_runs_out_of_memory_counts_as_not_fitting(monkeypatch):
    from packing_collators.budget._memory_budget import _peak_bytes

    model = tiny_model()
    fake = _FakeCuda(monkeypatch, model, peak=GIB, fail_at_forward=2)
    assert _peak_bytes(model, 64, 32, states_per_parameter=2) is None
    assert fake.forwards == 2 and all(p.grad is None for p in model.parameters())


def test_without_optimizer_states_one_pass_is_measured(monkeypatch):
    from packing_collators.budget._memory_budget import _peak_bytes

    model = tiny_model()
    fake = _FakeCuda(monkeypatch, model, peak=GIB)
    assert _peak_bytes(model, 64, 32, states_per_parameter=0) == GIB
    assert fake.forwards == 1 and fake.states_alive == []


@pytest.mark.parametrize("shallow", [5, 20, 200])
def test_a_line_too_shallow_into_out_of_memory_searches_down_to_near_the_real_limit(shallow):
    # measured on an H100: TRL's step at 2,048 and 4,096 tokens drew a line ~20x too shallow; the planned size
    # ran out of memory, and redrawing the line through it (as the whole card) left the budget at 4,096
    from packing_collators.budget import fit_token_budget

    longest, total, base, per_token = 2048, 80 * GIB, 6 * GIB, 1e4
    limit = int((0.9 * total - base) / (per_token * shallow))  # the real per-token cost is `shallow` times the line's

    def step(tokens):
        if tokens <= 2 * longest:
            return int(base + per_token * tokens)
        return None if tokens > limit else int(base + per_token * shallow * tokens)

    measured = []
    budget = fit_token_budget(lambda t: measured.append(t) or step(t), longest=longest, total_bytes=total)
    chosen = budget.max_tokens_per_batch
    assert chosen in measured and step(chosen) is not None
    assert chosen >= limit * 7 / 8 - 64  # near the largest size that fits (the search has 8 measurements)
    assert len(measured) <= 2 + 8


def test_the_usable_memory_is_the_cards_times_the_share_this_process_was_given(monkeypatch):
    import types

    import torch

    from packing_collators._gpu_memory import usable_gpu_bytes

    card = types.SimpleNamespace(total_memory=140 * GIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: card)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 1.0, raising=False)
    assert usable_gpu_bytes(0) == 140 * GIB
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 0.5, raising=False)
    assert usable_gpu_bytes(0) == 70 * GIB  # set_per_process_memory_fraction(0.5): the budget plans for 70 GiB
    monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction")  # torch < 2.7: the whole card
    assert usable_gpu_bytes(0) == 140 * GIB
