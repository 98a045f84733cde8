"""The ``packing-collators`` command line (also ``python -m packing_collators``).

Argument parsing and printing only: the numbers come from ``_analysis``, the data from
``_input_data`` (``_open_data``, ``_column_kinds``, ``_tokens``; ``_hub``: a Hub name out of reach,
said at once), the packing from :func:`pack_dataset`. A user error (a missing file, a file that does not parse or has no
examples, a column that is not there, non-integer token data, a max length every example
exceeds) is one line on stderr, ``packing-collators: error: ...``, and exit code 2.

    packing-collators analyze DATA --max-length N [--column C] [--tokenizer T] [--json] [--plot F.png]
    packing-collators pack DATA OUT --max-length N [--strategy S] [--overflow O] [--num-shards N --shard-index I]

``pack --num-shards N --shard-index I`` writes shard ``I`` only: a contiguous range of the rows
of the one global plan (every machine computes it from the lengths), so a job array packs a
corpus too large for one machine and the shards, in order, are the one-machine result.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from ..engine import Overflow
from ..offline import DatasetStrategy
from ._analysis import ANALYZE_OVERFLOW

__all__ = ["main"]

PROG = "packing-collators"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "data", metavar="DATA", help="save_to_disk folder, .parquet/.arrow/.json/.jsonl/.csv file, or Hub name"
    )
    parser.add_argument("--max-length", type=_positive_int, required=True, help="tokens per packed row")
    parser.add_argument(
        "--column", help="token ids, integer lengths, text or messages (default: input_ids, messages or text)"
    )
    parser.add_argument("--tokenizer", help="tokenizer (folder or Hub name) for a text or messages column")
    parser.add_argument("--split", help="split of a DatasetDict or Hub dataset (default: its only split, else 'train')")
    parser.add_argument(
        "--num-proc", type=_positive_int, help="tokenizing processes (default: up to 8 for 10,000+ examples)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffles (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Should I pack, and how? Analyze a dataset's lengths, or pack it to disk."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_analyze(commands)
    _add_pack(commands)
    return parser


def _add_analyze(commands) -> None:
    analyze = commands.add_parser("analyze", help="lengths, padding waste and each packing strategy's numbers")
    _add_data_arguments(analyze)
    analyze.add_argument(
        "--batch-size", type=_positive_int, default=8, help="examples per padded batch, rows per step (default 8)"
    )
    analyze.add_argument(
        "--max-tokens-per-batch",
        type=_positive_int,
        help="the sampler's token budget (default batch size x max length)",
    )
    analyze.add_argument(
        "--overflow",
        choices=ANALYZE_OVERFLOW,
        default="truncate",
        help="examples over the max length, as a training run would see them (default truncate: cut and counted)",
    )
    analyze.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table")
    analyze.add_argument(
        "--plot", metavar="FILE.png", help="write a length histogram and each strategy's efficiency (needs matplotlib)"
    )
    analyze.set_defaults(run=_analyze)


def _add_pack(commands) -> None:
    pack = commands.add_parser("pack", help="pack with pack_dataset and write the rows to disk")
    _add_data_arguments(pack)
    pack.add_argument("out", metavar="OUT", help="output: a save_to_disk folder, a .parquet or an .arrow file")
    pack.add_argument("--strategy", choices=get_args(DatasetStrategy), default="bfd", help="default bfd")
    pack.add_argument(
        "--overflow",
        choices=get_args(Overflow),
        default="error",
        help="examples over the max length (default error; split keeps every token, in pieces)",
    )
    pack.add_argument(
        "--num-shards", type=_positive_int, default=1, help="shards of a sharded build (one per job; default 1)"
    )
    pack.add_argument(
        "--shard-index", type=int, default=0, help="which shard this job writes, 0 to num-shards - 1 (default 0)"
    )
    pack.add_argument(
        "--keep-column",
        action="append",
        default=[],
        metavar="NAME",
        help="per-example column kept as a list per row (repeatable); PrePackedCollator(keep_columns=[NAME]) "
        "returns it per example",
    )
    pack.add_argument(
        "--remove-column",
        action="append",
        default=[],
        metavar="NAME",
        help="column left out of the packed rows (repeatable)",
    )
    pack.add_argument("--no-shuffle", action="store_true", help="keep packing order instead of shuffling the rows")
    pack.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    pack.add_argument("--json", action="store_true", help="print the statistics as JSON")
    pack.set_defaults(run=_pack)


def _lengths(args):
    from ._input_data import load_tokenizer, open_dataset, read_lengths

    dataset = open_dataset(args.data, split=args.split)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    return read_lengths(dataset, column=args.column, tokenizer=tokenizer, num_proc=args.num_proc)


def _analyze(args) -> int:
    from ._analysis import analyze_lengths
    from ._report import format_analysis, plot_analysis, require_matplotlib

    if args.plot:
        require_matplotlib()  # before the work, not after it
    lengths, column, kind = _lengths(args)
    analysis = analyze_lengths(
        lengths,
        args.max_length,
        batch_size=args.batch_size,
        max_tokens_per_batch=args.max_tokens_per_batch,
        overflow=args.overflow,
        seed=args.seed,
    )
    if args.json:
        print(json.dumps({"data": args.data, "column": column, "kind": kind, **analysis.as_dict()}, indent=2))
    else:
        print(format_analysis(analysis, source=f"{args.data}: column {column!r} ({kind})"))
    if args.plot:
        plot_analysis(lengths, analysis, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _pack(args) -> int:
    from ..offline import pack_dataset
    from ..sampler import lengths_from_dataset
    from ._analysis import check_max_length
    from ._input_data import load_tokenizer, open_dataset, packable_columns, token_ids, without_columns

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise ValueError(f"OUT {args.out!r} exists; pass --overwrite to replace it, or choose another path.")
    dataset = without_columns(open_dataset(args.data, split=args.split), args.remove_column)  # before tokenizing
    out.parent.mkdir(parents=True, exist_ok=True)  # a job array's shard-$I.parquet into a folder not made yet
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    dataset = token_ids(dataset, column=args.column, tokenizer=tokenizer, num_proc=args.num_proc)
    dataset = packable_columns(dataset, keep_columns=args.keep_column)
    if args.strategy != "wrapped" and args.overflow != "split":  # these cut long examples by design
        check_max_length(lengths_from_dataset(dataset), args.max_length)
    library_log = logging.getLogger("packing_collators")
    level = library_log.level
    library_log.setLevel(logging.ERROR)  # its one-line summary is printed below, with the details
    arrow_out = out.suffix.lower() == ".arrow"
    # the rows go to OUT itself (.arrow), or to a file beside it converted then deleted: never into DATA's folder
    cache_file = out if arrow_out else out.with_name(f".{out.name}.packing.arrow")
    try:
        packed, stats = pack_dataset(
            dataset,
            args.max_length,
            strategy=args.strategy,
            overflow=args.overflow,
            shuffle_rows=not args.no_shuffle,
            seed=args.seed,
            keep_columns=args.keep_column,
            num_proc=None if arrow_out else args.num_proc,  # one process, one file: OUT
            num_shards=args.num_shards,
            shard_index=args.shard_index,
            cache_file_name=str(cache_file),
            load_from_cache_file=False,
            return_stats=True,
        )
        if out.suffix.lower() == ".parquet":
            packed.to_parquet(str(out))
        elif not arrow_out:
            packed.save_to_disk(str(out))
    finally:
        library_log.setLevel(level)
        if not arrow_out:
            for path in cache_file.parent.glob(f"{cache_file.stem}*"):
                path.unlink()
    _print_packed(args, stats, len(packed))
    return 0


def _print_packed(args, stats, rows: int) -> None:
    """What ``pack`` wrote: the stats as JSON (``--json``), or their summary, a table and the output's name."""
    if args.json:
        shard = {"num_shards": args.num_shards, "shard_index": args.shard_index, "shard_rows": rows}
        print(json.dumps({"data": args.data, "out": args.out, **shard, **stats.as_dict()}, indent=2))
        return
    print(stats.summary())
    width = max(map(len, stats.as_dict()))
    for key, value in stats.as_dict().items():
        shown = f"{value:.4%}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else value
        print(f"  {key:<{width}}  {shown}")
    shard = f" (shard {args.shard_index} of {args.num_shards})" if args.num_shards > 1 else ""
    print(f"wrote {rows:,} rows to {args.out}{shard}")
    if args.keep_column:
        print(_kept_note(args.keep_column))


def _kept_note(names: Sequence[str]) -> str:
    """What the kept columns mean for training: PrePackedCollator refuses them unless told to carry them.

    >>> print(_kept_note(["source"]))
    kept per example: ['source'] (a list per row). PrePackedCollator refuses them unless you name them: PrePackedCollator(keep_columns=['source']) returns one value per example in each batch, to take out of the batch before the model's forward; or remove them before training (dataset.remove_columns(['source'])).
    """
    return (
        f"kept per example: {list(names)} (a list per row). PrePackedCollator refuses them unless you name them: "
        f"PrePackedCollator(keep_columns={list(names)}) returns one value per example in each batch, to take out "
        f"of the batch before the model's forward; or remove them before training "
        f"(dataset.remove_columns({list(names)}))."
    )


def _one_line(error: BaseException) -> str:
    from ._messages import as_command_line

    text = " ".join(str(error).split())
    if isinstance(error, KeyError):  # str(KeyError) is the repr of its key
        text = text.strip("'\"")
    return as_command_line(text) or type(error).__name__  # the library's overflow='split' is --overflow split here


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (0, or 2 for a user error).

    >>> main(["pack", "no/such/data.jsonl", "out", "--max-length", "8"])
    2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.run(args)
    except (ValueError, TypeError, OSError, ImportError) as error:
        print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
        return 2
