"""An :class:`~packing_collators.cli._analysis.Analysis` as the table ``packing-collators analyze`` prints, or as a plot.

The table (numbers with thousands separators; the tests read them back)::

    examples 32   tokens 516   empty 0   longer than 32: 0 (0.00%), 0 tokens cut off (truncate)
    lengths  min 2   mean 16.1   p50 4   p90 31   p95 31   p99 31   p99.9 31   max 31

    padding, 4 examples a batch              steps   padded tokens    waste
      random order                               8             964    46.5%
      length-grouped (group_by_length)           8             740    30.3%

    packing into rows of 32 tokens (4 rows a step); sampler: batches of up to 128 tokens (one a step)
      strategy      rows/batches     steps  efficiency    over lower bound  truncated    dropped  speed-up
      bfd                     17         5      94.85%         +0.00% (+0)          0          0     1.77x
      ...

The plot (matplotlib, imported only when asked for) shows the length histogram with
the row capacity marked, and each layout's efficiency.
"""

from __future__ import annotations

from ._analysis import Analysis

__all__ = ["format_analysis", "plot_analysis", "require_matplotlib"]

_LABELS = {"wrapped": "wrapped *", "sampler": "sampler"}


def _n(value: int) -> str:
    return f"{value:,}"


def format_analysis(analysis: Analysis, *, source: str = "") -> str:
    """The analysis as a plain-text table with a recommendation.

    >>> from packing_collators.cli._analysis import analyze_lengths
    >>> text = format_analysis(analyze_lengths([2, 30, 3, 28, 2, 31, 4, 29] * 4, max_length=32, batch_size=4))
    >>> for line in text.splitlines()[7:14]:
    ...     print(line)
    packing into rows of 32 tokens (4 rows a step); sampler: batches of up to 128 tokens (one a step)
      strategy      rows/batches     steps  efficiency    over lower bound  truncated    dropped  speed-up
      bfd                     17         5      94.85%         +0.00% (+0)          0          0     1.77x
      ffd                     17         5      94.85%         +0.00% (+0)          0          0     1.77x
      next_fit                24         6      67.19%        +41.18% (+7)          0          0     1.26x
      wrapped *               17         5      94.85%         +0.00% (+0)          0          0     1.77x
      sampler                  5         5      80.62%         +0.00% (+0)          0          0     1.51x
    """
    a = analysis
    longer = f"{_n(a.longer_examples)} ({a.longer_examples / a.examples:.2%})" if a.examples else "0"
    action = "cut off" if a.overflow == "truncate" else "left out"
    lines = []
    if source:
        lines.append(source)
    lines.append(
        f"examples {_n(a.examples)}   tokens {_n(a.tokens)}   empty {_n(a.empty_examples)}   "
        f"longer than {_n(a.max_length)}: {longer}, {_n(a.lost_tokens)} tokens {action} ({a.overflow})"
    )
    p = a.percentiles
    lines.append(
        f"lengths  min {_n(p['min'])}   mean {a.mean_length:,.1f}   "
        + "   ".join(f"{key} {_n(value)}" for key, value in p.items() if key not in ("min", "max"))
        + f"   max {_n(p['max'])}"
    )
    lines.append("")
    lines.append(
        f"{'padding, ' + str(a.batch_size) + ' examples a batch':<36}{'steps':>10}{'padded tokens':>16}{'waste':>9}"
    )
    for padding in a.padding:
        label = "random order" if padding.order == "random" else "length-grouped (group_by_length)"
        lines.append(f"  {label:<34}{_n(padding.steps):>10}{_n(padding.padded_tokens):>16}{padding.waste:>9.1%}")
    lines.append("")
    lines.append(
        f"packing into rows of {_n(a.max_length)} tokens ({a.batch_size} rows a step); "
        f"sampler: batches of up to {_n(a.max_tokens_per_batch)} tokens (one a step)"
    )
    lines.append(
        f"  {'strategy':<12}{'rows/batches':>14}{'steps':>10}{'efficiency':>12}{'over lower bound':>20}"
        f"{'truncated':>11}{'dropped':>11}{'speed-up':>10}"
    )
    for packing in a.packings:
        over = f"{packing.rows_over_lower_bound:+.2%} (+{_n(packing.rows - packing.lower_bound)})"
        lines.append(
            f"  {_LABELS.get(packing.strategy, packing.strategy):<12}{_n(packing.rows):>14}{_n(packing.steps):>10}"
            f"{packing.efficiency:>12.2%}{over:>20}{_n(packing.truncated_examples):>11}"
            f"{_n(packing.dropped_examples):>11}{packing.speedup:>9.2f}x"
        )
    wrapped = a.packing("wrapped")
    lines.append(
        f"  * wrapped: every token kept, examples split across rows ({_n(wrapped.split_examples)} examples split); "
        "example boundaries are not kept"
    )
    lines.append("  speed-up: padded tokens (random order) / packed slots (rows x row length, or batches x budget)")
    lines.append("")
    r = a.recommendation
    verdict = f"pack ({r.strategy}), about {r.speedup:.2f}x fewer token slots" if r.pack else "padding is fine"
    lines.append(f"recommendation: {verdict}; max length {_n(r.max_length)}, token budget {_n(r.max_tokens_per_batch)}")
    lines.extend(f"  - {reason}" for reason in r.reasons)
    return "\n".join(lines)


def require_matplotlib():
    """``matplotlib.pyplot`` (non-interactive backend), or an ImportError that says how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "--plot needs matplotlib, which is not installed; install it with "
            "pip install 'packing-collators[bench]' (or pip install matplotlib)."
        ) from None
    return plt


def plot_analysis(lengths, analysis: Analysis, path: str) -> None:
    """Write a PNG: the length histogram with the capacity marked, and each layout's efficiency."""
    plt = require_matplotlib()
    figure, (hist, bars) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    hist.hist(lengths, bins=100, color="#4c72b0")
    hist.axvline(analysis.max_length, color="#c44e52", linestyle="--", label=f"max length {analysis.max_length:,}")
    hist.set_xlabel("tokens per example")
    hist.set_ylabel("examples")
    hist.set_title(f"{analysis.examples:,} examples, {analysis.tokens:,} tokens")
    hist.legend()
    names = [f"padded\n{p.order.split('-')[-1]}" for p in analysis.padding] + [p.strategy for p in analysis.packings]
    values = [1 - p.waste for p in analysis.padding] + [p.efficiency for p in analysis.packings]
    colors = ["#8c8c8c"] * len(analysis.padding) + ["#55a868"] * len(analysis.packings)
    bars.bar(names, values, color=colors)
    for x, value in enumerate(values):
        bars.text(x, value, f"{value:.1%}", ha="center", va="bottom", fontsize=8)
    bars.set_ylim(0, 1.1)
    bars.set_ylabel("real tokens / slots")
    bars.set_title("efficiency")
    bars.tick_params(axis="x", labelsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
