"""Sweep every causal-LM architecture of the installed transformers through check_packing_support.

For every ``model_type -> class`` of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny model is built
from its config class (2 layers, hidden 32, 4 heads, vocab 128: the ``GENERIC`` table below, a
few ``SPECIAL`` cases on top; float32, CPU, seeded, ``use_cache=False``), and for each attention
implementation (eager, sdpa, flex_attention) one row records:

    verdict          accepted / refused / cannot build / not supported / error
    loss difference  |packed - padded| / |padded|, the loss on four random examples (7, 12, 5, 9
                     tokens) collated by FlatteningCollator vs right-padded with an attention_mask
    reason           why it was refused (static check or probe) or what failed

An ``accepted`` row whose loss difference is over 1e-5 is accepted-and-wrong: check_packing_support
let through a model that packing changes. That count must be 0. ``refused`` rows with a tiny loss
difference are false refusals (the checks are stricter than needed for that model).

flex_attention runs uncompiled (PyTorch's unfused reference, block mask built without compiling)
unless ``--compile-flex``: transformers compiles flex and its block mask per shape, which on a 2-core
CPU takes 10-60 s per model (hours for the sweep); the block mask, which keeps examples apart, is the
same either way.
Cost: 0.01-4 s per model and implementation; the whole sweep (196 model types, 576 rows) took 128 s
on the project's 2-core CPU machine (transformers 5.24, torch 2.13), under 1 GB of memory.

Usage: python scripts/architecture_sweep.py [--models llama gpt2 ...] [--attention eager sdpa]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the tiny configs and the shared module
from _architectures import (  # noqa: E402
    ATTENTIONS,
    LENGTHS,
    WRONG,
    causal_lm_classes,
    markdown,
    quiet,
    summarise,
    sweep_model,
    uncompiled_flex,
)
from _shared import command, machine, write_results  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", help="model types to sweep (default: every causal LM)")
    parser.add_argument("--attention", nargs="*", default=list(ATTENTIONS), choices=ATTENTIONS)
    parser.add_argument(
        "--compile-flex", action="store_true", help="let transformers compile flex_attention (slow on CPU)"
    )
    parser.add_argument("--name", default="architecture_sweep", help="results/<name>.md and .json")
    args = parser.parse_args()

    import torch
    import transformers

    started = time.perf_counter()
    rows = []
    for model_type, class_name in causal_lm_classes(args.models):
        with quiet(), contextlib.nullcontext() if args.compile_flex else uncompiled_flex():
            new = sweep_model(model_type, class_name, args.attention)
        for r in new:
            print(
                f"{r['model_type']:28} {'prepared' if r.get('prepared') else '':8} {r['attention']:15} {r['verdict']:14} "
                f"{'' if r['loss_difference'] is None else format(r['loss_difference'], '.1e'):9} {r['reason'][:90]}",
                flush=True,
            )
        rows += new
    header = {
        "command": command(),
        "machine": machine(),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seconds": time.perf_counter() - started,
        "compile_flex": args.compile_flex,
        "lengths": LENGTHS,
        "threshold": WRONG,
    }
    summary = summarise(rows)
    print(json.dumps(summary))
    write_results(args.name, markdown(rows, summary, header), {**header, "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
