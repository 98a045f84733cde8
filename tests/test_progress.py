"""Progress bars for long work: planning an epoch (packing_collators/_progress.py's rule) and ``analyze``.

A bar shows on stderr for long work, not for short work, and not when ``datasets`` or
``transformers`` has progress bars off; it changes nothing in what is computed.
"""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import transformers.utils.logging as transformers_logging

from packing_collators import MultipackBatchSampler
from packing_collators.cli import _analysis as analysis_module
from packing_collators.cli import main
from packing_collators.cli._analysis import analyze_lengths
from packing_collators.sampler import _epoch_plan, plan_epoch


@pytest.fixture
def bars_on():
    """Progress bars on in datasets and transformers for the test, then as they were."""
    were = datasets.utils.logging.is_progress_bar_enabled(), transformers_logging.is_progress_bar_enabled()
    datasets.enable_progress_bars()
    transformers_logging.enable_progress_bar()
    yield
    (datasets.enable_progress_bars if were[0] else datasets.disable_progress_bars)()
    (transformers_logging.enable_progress_bar if were[1] else transformers_logging.disable_progress_bar)()


@pytest.fixture
def short_threshold(monkeypatch):
    """100 examples count as long work, so a test plans a long epoch in milliseconds."""
    monkeypatch.setattr(_epoch_plan, "PROGRESS_MIN_EXAMPLES", 100)
    monkeypatch.setattr(analysis_module, "PROGRESS_MIN_EXAMPLES", 100)


def lengths(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 64, n)


def test_planning_a_long_epoch_shows_a_bar(bars_on, capsys):
    many = np.full(_epoch_plan.PROGRESS_MIN_EXAMPLES, 8)  # the real threshold: 4,000,000 examples (~1 s)
    plan_epoch(many, 4096, epoch=3)
    err = capsys.readouterr().err
    assert "planning epoch 3" in err and "100%" in err and "4.00M/4.00M" in err
    plan_epoch(many[:-1], 4096)  # one example short of long work
    assert capsys.readouterr().err == ""


def test_short_work_shows_no_bar(bars_on, capsys):
    plan_epoch(lengths(1000), 256)
    analyze_lengths(lengths(1000), 64)
    list(MultipackBatchSampler(lengths(1000), 256))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "turn_off",
    [datasets.disable_progress_bars, transformers_logging.disable_progress_bar],
    ids=["datasets", "transformers"],
)
def test_bars_turned_off_in_datasets_or_transformers_silence_it(turn_off, bars_on, short_threshold, capsys):
    plan_epoch(lengths(1000), 256)
    analyze_lengths(lengths(1000), 64)
    err = capsys.readouterr().err
    assert "planning epoch 0" in err and "analyzing 1,000 examples" in err
    turn_off()
    plan_epoch(lengths(1000), 256)
    analyze_lengths(lengths(1000), 64)
    assert capsys.readouterr().err == ""
    plan_epoch(lengths(1000), 256, progress=True)  # asked for: shown anyway
    assert "planning epoch 0" in capsys.readouterr().err


def test_the_bar_changes_nothing_in_the_plan(capsys):
    for group_size in (None, 150):
        shown = plan_epoch(lengths(1000), 256, num_replicas=3, group_size=group_size, progress=True)
        silent = plan_epoch(lengths(1000), 256, num_replicas=3, group_size=group_size, progress=False)
        assert np.array_equal(shown.example, silent.example)
        assert np.array_equal(shown.row_offsets, silent.row_offsets)
        assert shown.stats() == silent.stats()
    err = capsys.readouterr().err
    assert err.count("1000/1000") >= 2  # the bar reached the end each time (one update per group)


def test_the_sampler_shows_one_bar_rank_0s(bars_on, short_threshold, capsys):
    def plan(rank, progress=None):
        sampler = MultipackBatchSampler(lengths(1000), 256, num_replicas=2, rank=rank, progress=progress)
        return len(sampler), capsys.readouterr().err

    assert "planning epoch 0" in plan(rank=0)[1]
    assert plan(rank=1)[1] == ""
    assert "planning epoch 0" in plan(rank=1, progress=True)[1]
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        MultipackBatchSampler(lengths(10), 256, progress="yes")


def test_cli_analyze_shows_a_bar_per_stage_on_stderr(bars_on, short_threshold, capsys, tmp_path):
    data = tmp_path / "lengths.jsonl"
    data.write_text("".join(json.dumps({"length": int(n)}) + "\n" for n in lengths(500)))
    assert main(["analyze", str(data), "--max-length", "64", "--column", "length", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["examples"] == 500  # the JSON on stdout stays clean
    assert "analyzing 500 examples" in err and "6/6" in err
    assert "planning epoch" not in err  # the sampler's plan inside the analysis has no bar of its own


def test_pack_dataset_follows_the_same_rule_as_the_sampler():
    # pack_dataset read only datasets' switch: transformers.utils.logging.disable_progress_bar() left its bar on
    import transformers

    from packing_collators.offline._arrow_rows import CHUNK_TOKENS
    from packing_collators.offline._options import PackOptions
    from packing_collators.offline._pack_dataset import _show_progress

    long_work, options = 4 * CHUNK_TOKENS, PackOptions(max_length=8)
    assert _show_progress(options, long_work) and not _show_progress(options, long_work - 1)
    transformers.utils.logging.disable_progress_bar()
    try:
        assert not _show_progress(options, long_work)
        assert _show_progress(PackOptions(max_length=8, progress=True), long_work)
    finally:
        transformers.utils.logging.enable_progress_bar()
