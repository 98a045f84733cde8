"""The hybrid GPU harness measures what its results say (benchmarks/gpu/hybrid_throughput.py, in its CPU --smoke form).

Nemotron-H (Mamba2) and LFM2 (short convolutions), tiny and float32, their stateful layers on the tests'
torch reference kernels (``--kernels reference``: the GPU's varlen paths, on the CPU). Checked: each layer
kind's path is the varlen one, the exactness figures are float32's (packed equals alone, logits and
gradients, and equals alone on the same kernels), every mode was timed for its steps, each ratio is
packed's rate over the mode's, and the padded-on-kernels batches are the padded batches with each row's
padding a segment of its own.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "hybrid_throughput.py"
MODELS = ("nemotron_h", "lfm2")
MODES = ("packed", "oracle", "oracle_work", "padded", "padded_kernels")

pytestmark = pytest.mark.slow


def _harness():
    spec = importlib.util.spec_from_file_location("hybrid_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts benchmarks/ and benchmarks/gpu on sys.path
    return module


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("hybrid")
    harness, argv = _harness(), sys.argv
    try:
        for model in MODELS:
            sys.argv = [str(SCRIPT), "--model", model, "--smoke", "--kernels", "reference", "--distributions", "sft",
                        "--steps", "1", "--padded-rows-per-call", "3", "--out", str(out)]  # fmt: skip
            harness.main(sys.argv[1:])  # the results' "command" is read from sys.argv
    finally:
        sys.argv = argv
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("model", MODELS)
def test_the_stateful_layers_ran_on_the_varlen_path_and_matched_each_example_alone(results, model):
    run = results[model]
    stateful = [path for kind, path in run["paths"].items() if kind != "attention"]
    assert stateful and all(path.startswith("reference varlen kernels on cpu") for path in stateful), run["paths"]
    exact = run["exactness"]
    assert exact["max_logit_diff_vs_alone"] < 1e-5 and exact["packed_vs_kernel_alone"] < 1e-5
    assert exact["float32_grad_rel_diff_vs_alone"] < 1e-4 and exact["float32_grad_rel_diff_stateful_layers"] < 1e-4
    assert exact["float32_grad_rel_diff_vs_kernel_alone"] < 1e-4  # the same kernels, each example alone
    assert exact["parameters_compared"] > 30 and len(exact["examples"]) == 6


@pytest.mark.parametrize("model", MODELS)
def test_every_mode_timed_and_each_ratio_is_packed_over_it(results, model):
    sft = results[model]["distributions"]["sft"]
    rates = sft["tokens_per_s"]
    assert set(rates) == set(MODES)
    assert [len(steps) for steps in sft["rounds_steps_ms"]["packed"]] == [0]  # the CPU has no CUDA events
    for mode in MODES[1:]:
        assert sft[f"packed_vs_{mode}"] == pytest.approx(rates["packed"] / rates[mode])
    assert results[model]["padded_path"].startswith("transformers'")


def test_padded_batches_on_the_kernels_make_each_rows_padding_a_segment():
    from packing_collators.models import row_segments

    harness = _harness()
    batch = harness.padded_batch([{"input_ids": [5] * n} for n in (3, 8, 6)], multiple=4)  # width 8
    moved = harness.with_padding_segments(batch)
    assert moved["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4], list(range(8)), [0, 1, 2, 3, 4, 5, 0, 1]]
    segments = row_segments(tuple(batch["input_ids"].shape), position_ids=moved["position_ids"])
    assert segments.cu_seq_lens.tolist() == [0, 3, 8, 16, 22, 24]
    assert harness.real_tokens(moved) == 17 == int(torch.tensor([3, 8, 6]).sum())


def test_padded_batches_split_into_calls_keep_every_row_at_its_width():
    harness = _harness()
    batches = [harness.padded_batch([{"input_ids": [5] * n} for n in lengths], multiple=4)
               for lengths in ((3, 8, 6, 2, 7), (1, 2))]  # fmt: skip
    calls = harness.rows_per_call(batches, 2)
    assert [tuple(c["input_ids"].shape) for c in calls] == [(2, 8), (2, 8), (1, 8), (2, 4)]
    for key in batches[0]:
        assert torch.equal(torch.cat([c[key] for c in calls[:3]]), batches[0][key])
    assert sum(harness.real_tokens(c) for c in calls) == 3 + 8 + 6 + 2 + 7 + 1 + 2
