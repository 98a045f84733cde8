"""The packing-collators command line: the numbers it prints are the library's, and each user error is one line, exit 2."""

from __future__ import annotations

import json
import math
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, load_from_disk
from test_data_loading import make_tokenizer, texts

from packing_collators import MultipackBatchSampler, pack_dataset, pack_lengths
from packing_collators.cli import main

MAX_LENGTH, BATCH = 512, 4
STRATEGIES = ("bfd", "ffd", "next_fit", "wrapped", "sampler")


@pytest.fixture(scope="module")
def lengths(lognormal) -> np.ndarray:
    return lognormal(1500, mean=5.0, sigma=0.8, low=4, high=900)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, lengths) -> Path:
    """input_ids (a parquet file and a save_to_disk folder) and lengths (parquet) of the same examples."""
    folder = tmp_path_factory.mktemp("cli-data")
    ids = [list(range(1, int(n) + 1)) for n in lengths]
    Dataset.from_dict({"input_ids": ids, "source": ["web"] * len(ids)}).save_to_disk(str(folder / "disk"))
    Dataset.from_dict({"input_ids": ids}).to_parquet(str(folder / "tokens.parquet"))
    pq.write_table(pa.table({"length": lengths}), folder / "lengths.parquet")
    return folder


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def table(text: str) -> dict[str, list[str]]:
    """The strategy rows of the printed table, as their whitespace-separated cells."""
    rows = {}
    for line in text.splitlines():
        cells = [cell for cell in line.split() if cell != "*"]
        if cells and cells[0] in STRATEGIES and len(cells) == 9:
            rows[cells[0]] = cells
    return rows


def test_analyze_prints_the_engine_and_sampler_numbers(capsys, data_dir, lengths):
    code, out, err = run(
        capsys, "analyze", data_dir / "tokens.parquet", "--max-length", MAX_LENGTH, "--batch-size", BATCH
    )
    assert code == 0, err
    assert f"examples {len(lengths):,}   tokens {int(lengths.sum()):,}" in out
    longer = int((lengths > MAX_LENGTH).sum())
    assert longer > 0 and f"longer than {MAX_LENGTH}: {longer:,}" in out
    rows = table(out)
    assert list(rows) == list(STRATEGIES)
    for strategy in ("bfd", "ffd", "next_fit"):
        stats = pack_lengths(lengths, MAX_LENGTH, strategy=strategy, overflow="truncate").stats()
        _, n_rows, steps, efficiency, over, over_rows, truncated, dropped, _ = rows[strategy]
        assert n_rows == f"{stats['rows']:,}"
        assert steps == f"{math.ceil(stats['rows'] / BATCH):,}"
        assert efficiency == f"{stats['efficiency']:.2%}"
        assert over_rows == f"(+{stats['rows'] - stats['lower_bound_rows']:,})"
        assert (truncated, dropped) == (f"{stats['truncated_examples']:,}", "0")
    sampler = MultipackBatchSampler(np.minimum(lengths, MAX_LENGTH), BATCH * MAX_LENGTH, num_replicas=1, rank=0).stats()
    assert rows["sampler"][1] == rows["sampler"][2] == f"{sampler['batches_per_epoch']:,}"
    assert rows["sampler"][3] == f"{sampler['efficiency']:.2%}"
    assert rows["wrapped"][1] == f"{math.ceil(lengths.sum() / MAX_LENGTH):,}"
    assert "boundaries are not kept" in out and "recommendation:" in out


def test_analyze_json_is_the_library_statistics(capsys, data_dir, lengths):
    code, out, _ = run(
        capsys,
        "analyze",
        data_dir / "lengths.parquet",
        "--column",
        "length",
        "--max-length",
        MAX_LENGTH,
        "--overflow",
        "drop",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert (report["column"], report["kind"], report["examples"]) == ("length", "lengths", len(lengths))
    packings = {p["strategy"]: p for p in report["packings"]}
    for strategy in ("bfd", "ffd", "next_fit"):
        stats = pack_lengths(lengths, MAX_LENGTH, strategy=strategy, overflow="drop").stats()
        assert packings[strategy]["rows"] == stats["rows"]
        assert packings[strategy]["efficiency"] == stats["efficiency"]
        assert packings[strategy]["dropped_examples"] == stats["dropped_examples"] > 0
    _, wrapped = pack_dataset(
        Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]}),
        MAX_LENGTH,
        strategy="wrapped",
        return_stats=True,
    )
    assert (packings["wrapped"]["rows"], packings["wrapped"]["split_examples"]) == (
        wrapped.rows,
        wrapped.split_examples,
    )
    waste = report["padding"][0]["waste"]
    assert waste == 1 - report["padding"][0]["tokens"] / report["padding"][0]["padded_tokens"]
    assert packings["bfd"]["speedup"] == report["padding"][0]["padded_tokens"] / (packings["bfd"]["rows"] * MAX_LENGTH)


def test_analyze_tokenizes_text(capsys, tmp_path):
    tokenizer_dir = make_tokenizer(tmp_path / "tok")
    sample = texts(300)
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample))
    code, out, _ = run(capsys, "analyze", path, "--max-length", 64, "--tokenizer", tokenizer_dir, "--json")
    assert code == 0
    from transformers import AutoTokenizer

    counts = [len(ids) for ids in AutoTokenizer.from_pretrained(tokenizer_dir)(sample)["input_ids"]]
    report = json.loads(out)
    assert (report["kind"], report["examples"], report["tokens"]) == ("text", 300, sum(counts))
    assert report["percentiles"]["max"] == max(counts)


@pytest.mark.parametrize("output", ["packed", "packed.parquet"])
def test_pack_writes_what_pack_dataset_makes(capsys, data_dir, tmp_path, output):
    out_path = tmp_path / output
    code, out, err = run(
        capsys, "pack", data_dir / "tokens.parquet", out_path, "--max-length", MAX_LENGTH, "--overflow", "truncate"
    )
    assert code == 0, err
    source = Dataset.from_parquet(str(data_dir / "tokens.parquet"))
    expected, stats = pack_dataset(source, MAX_LENGTH, overflow="truncate", return_stats=True)
    assert out.splitlines()[0] == stats.summary()
    assert f"wrote {stats.rows:,} rows to {out_path}" in out
    written = Dataset.from_parquet(str(out_path)) if output.endswith(".parquet") else load_from_disk(str(out_path))
    assert len(written) == stats.rows
    assert written["input_ids"][:] == expected["input_ids"][:]
    assert written["seq_lengths"][:] == expected["seq_lengths"][:]


def test_pack_json_strategy_and_kept_columns(capsys, data_dir, lengths, tmp_path):
    code, out, _ = run(
        capsys,
        "pack",
        data_dir / "disk",
        tmp_path / "out",
        "--max-length",
        1024,
        "--strategy",
        "next_fit",
        "--keep-column",
        "source",
        "--no-shuffle",
        "--json",
    )
    assert code == 0
    stats = pack_lengths(lengths, 1024, strategy="next_fit").stats()
    report = json.loads(out)
    assert (report["strategy"], report["rows"], report["efficiency"]) == (
        "next_fit",
        stats["rows"],
        stats["efficiency"],
    )
    written = load_from_disk(str(tmp_path / "out"))
    assert written.column_names == ["input_ids", "position_ids", "seq_lengths", "source"]
    assert sum(map(len, written["seq_lengths"])) == len(lengths)


def test_a_kept_column_reaches_prepacked_collator_when_named_there(capsys, data_dir, tmp_path):
    from packing_collators import PrePackedCollator

    code, out, _ = run(
        capsys, "pack", data_dir / "disk", tmp_path / "out", "--max-length", 1024, "--keep-column", "source"
    )
    assert code == 0
    assert "PrePackedCollator(keep_columns=['source']) returns one value per example" in out
    rows = [load_from_disk(str(tmp_path / "out"))[i] for i in range(2)]
    examples = sum(len(row["seq_lengths"]) for row in rows)
    batch = PrePackedCollator(keep_columns=["source"])(rows)
    assert batch["source"] == ["web"] * examples and len(batch["cu_seq_lens_q"]) == examples + 1
    with pytest.raises(
        ValueError, match=r"Row 0: 'source' has .*PrePackedCollator\(keep_columns=\['source'\]\) and take it out"
    ):
        PrePackedCollator()(rows)


@pytest.mark.parametrize("suffix", [".arrow", ".parquet", ""])
def test_pack_shards_of_a_job_array_concatenate_to_the_whole(capsys, data_dir, tmp_path, suffix):
    source = load_from_disk(str(data_dir / "disk")).remove_columns(["source"])
    whole = pack_dataset(source, MAX_LENGTH, overflow="split", seed=3, keep_in_memory=True)
    parts = []
    for index in range(3):  # one job each, as a SLURM array would run them
        out = tmp_path / f"shard-{index}{suffix}"
        argv = ["pack", data_dir / "disk", out, "--max-length", MAX_LENGTH, "--overflow", "split", "--seed", 3]
        code, printed, err = run(capsys, *argv, "--remove-column", "source", "--num-shards", 3, "--shard-index", index)
        assert code == 0, err
        part = (
            Dataset.from_file(str(out))
            if suffix == ".arrow"
            else (Dataset.from_parquet(str(out)) if suffix == ".parquet" else load_from_disk(str(out)))
        )
        assert f"wrote {len(part):,} rows to {out} (shard {index} of 3)" in printed
        parts.append(part[:])
    assert {key: sum((part[key] for part in parts), []) for key in parts[0]} == whole[:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # temp rows removed
    assert not list((data_dir / "disk").glob("cache-*"))  # nothing written beside the input


def test_pack_refuses_a_shard_index_out_of_range(capsys, data_dir, tmp_path):
    code, _, err = run(
        capsys,
        "pack",
        data_dir / "tokens.parquet",
        tmp_path / "o.arrow",
        "--max-length",
        MAX_LENGTH,
        "--overflow",
        "truncate",
        "--num-shards",
        2,
        "--shard-index",
        2,
    )
    assert code == 2 and "--shard-index 2 is out of range for --num-shards 2; shards are numbered 0 to 1." in err


def test_plot_writes_a_png(capsys, data_dir, tmp_path):
    pytest.importorskip("matplotlib")
    code, out, _ = run(
        capsys,
        "analyze",
        data_dir / "lengths.parquet",
        "--column",
        "length",
        "--max-length",
        512,
        "--plot",
        tmp_path / "p.png",
    )
    assert code == 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_is_one_line(capsys, monkeypatch, data_dir, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run(
        capsys,
        "analyze",
        data_dir / "lengths.parquet",
        "--column",
        "length",
        "--max-length",
        512,
        "--plot",
        tmp_path / "p.png",
    )
    assert code == 2 and out == ""
    assert err == (
        "packing-collators: error: --plot needs matplotlib, which is not installed; install it with "
        "pip install 'packing-collators[bench]' (or pip install matplotlib).\n"
    )


def _bad_data(folder: Path) -> dict[str, Path]:
    Dataset.from_dict({"input_ids": [[0.5, 1.5], [2.5]]}).to_parquet(str(folder / "floats.parquet"))
    Dataset.from_dict({"length": [3.0, 4.5]}).to_parquet(str(folder / "float_lengths.parquet"))
    Dataset.from_dict({"input_ids": [[1] * 20, [2] * 30]}).to_parquet(str(folder / "long.parquet"))
    Dataset.from_dict({"text": ["a b", "c"]}).to_parquet(str(folder / "text.parquet"))
    (folder / "exists").mkdir()
    return {p.stem: p for p in folder.iterdir()}


ERRORS = [
    (
        ["analyze", "{tmp}/nope.jsonl", "--max-length", "8"],
        "DATA '{tmp}/nope.jsonl' does not exist: no such file or folder",
    ),
    (["pack", "{tmp}/nope", "{tmp}/o", "--max-length", "8"], "DATA '{tmp}/nope' does not exist"),
    (
        ["analyze", "{data}/tokens.parquet", "--column", "ids", "--max-length", "8"],
        "The dataset has no column 'ids' (its columns: ['input_ids']); pass --column",
    ),
    (
        ["analyze", "{tmp}/floats.parquet", "--max-length", "8"],
        "Column 'input_ids' holds list<element: double>, not token data: it must hold token ids",
    ),
    (
        ["analyze", "{tmp}/float_lengths.parquet", "--column", "length", "--max-length", "8"],
        "Column 'length' holds double, not token data",
    ),
    (
        ["analyze", "{tmp}/long.parquet", "--max-length", "8"],
        "Every example is longer than max length 8 (the shortest has 20 tokens); raise the max length (--max-length) to at least 20.",
    ),
    (["pack", "{tmp}/long.parquet", "{tmp}/o", "--max-length", "8"], "Every example is longer than max length 8"),
    (
        ["pack", "{tmp}/long.parquet", "{tmp}/o", "--max-length", "25"],
        "Example 1 has 30 tokens, more than --max-length 25 (1 example(s) too long, the longest 30 tokens). Pass --overflow split",
    ),
    (
        ["pack", "{data}/tokens.parquet", "{tmp}/exists", "--max-length", "8"],
        "OUT '{tmp}/exists' exists; pass --overwrite",
    ),
    (
        ["pack", "{data}/lengths.parquet", "{tmp}/o", "--column", "length", "--max-length", "8"],
        "Column 'length' holds lengths only",
    ),
    (["pack", "{data}/disk", "{tmp}/o", "--max-length", "1024"], "Columns ['source'] are not per-token"),
    (["analyze", "{tmp}/text.parquet", "--max-length", "8"], "Column 'text' holds text; pass --tokenizer NAME_OR_PATH"),
    (
        ["analyze", "{tmp}/text.parquet", "--max-length", "8", "--tokenizer", "{tmp}/exists"],
        "--tokenizer '{tmp}/exists' could not be loaded (",
    ),
    (
        ["analyze", "{tmp}/text.parquet", "--max-length", "8", "--tokenizer", "{tmp}/nope"],
        "--tokenizer '{tmp}/nope' does not exist",
    ),
]


@pytest.mark.parametrize("argv, message", ERRORS, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in enumerate(ERRORS)])
def test_user_errors_are_one_line_with_exit_code_2(capsys, tmp_path, data_dir, argv, message):
    _bad_data(tmp_path)
    capsys.readouterr()  # the progress bars of writing the files
    fill = {"tmp": tmp_path, "data": data_dir}
    code, out, err = run(capsys, *[a.format(**fill) for a in argv])
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("packing-collators: error: ")
    assert message.format(**fill) in err
    assert "Traceback" not in err and out == ""


def test_argument_errors_are_argparse_style(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "data.parquet", "--max-length", "0"])
    assert exit_info.value.code == 2
    assert "argument --max-length: must be a positive integer, got '0'" in capsys.readouterr().err
    assert main([]) == 2 and "analyze" in capsys.readouterr().err


def test_python_dash_m(capsys, monkeypatch, data_dir):
    argv = [
        "packing_collators",
        "analyze",
        str(data_dir / "lengths.parquet"),
        "--column",
        "length",
        "--max-length",
        "512",
        "--json",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("packing_collators", run_name="__main__")
    assert exit_info.value.code == 0
    assert json.loads(capsys.readouterr().out)["max_length"] == 512


def test_console_script_runs_end_to_end(capsys, data_dir):
    """The installed entry point, in a real process: same JSON as in-process, and an error exits 2 with one line."""
    script = Path(sys.executable).with_name("packing-collators")
    if not script.exists():
        pytest.skip("the console script is not installed (pip install -e .)")
    args = ["analyze", str(data_dir / "lengths.parquet"), "--column", "length", "--max-length", "512", "--json"]
    done = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert main(args) == 0
    assert json.loads(done.stdout) == json.loads(capsys.readouterr().out)
