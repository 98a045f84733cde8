"""torchtitan's Llama 3.1 8B on scale_8b.py's documents: its own Trainer, loop, FSDP2, checkpointing and logs.

    torchrun --nproc-per-node 4 --local-ranks-filter 0 --role rank --tee 3 benchmarks/gpu/_scale_8b_titan.py \\
        --data-stats OUT/titan.json  --model.flavor 8B_varlen --training.seq_len 8192 --training.steps 15 ...

Options before torchtitan's: ``--data-distribution/--data-examples/--data-max-length/--data-seed`` (the documents,
``_scale_8b_data.py``), ``--data-stats`` (rank 0 writes the documents of its first rows there, for the MFU of the
causal documents), ``--cpu`` (the CPU check: torchtitan's device hooks pointed at the CPU, gloo). Everything else
is torchtitan's own command line (``--model.flavor``, ``--training.*``, ...); ``--model.name`` is set here.

What this adds to torchtitan 0.2.2 (``pip install torchtitan==0.2.2``, see torchtitan_wheels.sh for why not 0.3.0):
a TrainSpec ``scale8b_llama3``, llama3's own but for two builders, so that nothing is downloaded:

    tokenizer   knows only the end-of-text id (128001), which its varlen flavour reads as a document boundary
    dataloader  its ParallelAwareDataloader over rows cut from the documents as its HuggingFaceTextDataset cuts
                text (_scale_8b_data.stream_rows): {"input": (b, s)}, labels (b, s), every token a target

The flavours: ``8B`` (sdpa, one causal sequence per row: its published benchmark's setting, the documents'
boundaries ignored) and ``8B_varlen`` (torch's varlen attention over the documents, block-causal: the same
work as ours). Its metric lines (``step: ... tps: ... mfu: ...``) are what scale_8b.py --report reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # _scale_8b_data, benchmarks/_shared

SPEC = "scale8b_llama3"


def _options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--data-distribution", default="long_tail")
    parser.add_argument("--data-examples", type=int, default=3000)
    parser.add_argument("--data-max-length", type=int, default=8192)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--data-stats", type=Path, help="rank 0 writes its first rows' documents here (JSON)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU with gloo (the CPU check)")
    return parser.parse_known_args(argv)


def _stub_missing_tensorboard() -> None:
    """torchtitan's metrics module imports torch.utils.tensorboard, which needs the tensorboard package; the image
    has none and the benchmark logs no TensorBoard, so a stand-in module answers the import."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        stub = types.ModuleType("torch.utils.tensorboard")
        stub.SummaryWriter = None
        sys.modules["torch.utils.tensorboard"] = stub


def _point_at_cpu() -> None:
    """The CPU check: torchtitan's device type and module (imported by name in five modules) become the CPU's."""
    import torch
    import torchtitan.components.metrics
    import torchtitan.distributed.parallel_dims
    import torchtitan.distributed.utils
    import torchtitan.tools.profiling
    import torchtitan.tools.utils

    def nothing(*_args, **_kwargs):
        return None

    cpu = types.SimpleNamespace(
        set_device=nothing, current_device=lambda: 0, get_device_name=lambda *_: "cpu", synchronize=nothing,
        get_device_properties=lambda *_: types.SimpleNamespace(total_memory=2**34), reset_peak_memory_stats=nothing,
        empty_cache=nothing, memory_stats=lambda *_: {}, manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
    )  # fmt: skip
    for module in (torchtitan.tools.utils, torchtitan.components.metrics, torchtitan.distributed.utils,
                   torchtitan.distributed.parallel_dims, torchtitan.tools.profiling):  # fmt: skip
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = cpu


def register(options: argparse.Namespace) -> None:
    """Register the ``scale8b_llama3`` TrainSpec: llama3's, with the documents' tokenizer and dataloader."""
    import numpy as np
    import torch
    from _scale_8b_data import documents, eos_id, rank_order, row_documents, stream_rows
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.tokenizer import BaseTokenizer
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

    base = get_train_spec("llama3")

    class EndOfTextOnly(BaseTokenizer):
        """No vocabulary file: the rows are token ids already; only the end-of-text id is needed."""

        def __init__(self, vocab: int):
            super().__init__()
            self.eos_id, self.vocab = eos_id(vocab), vocab

        def encode(self, *args, **kwargs) -> list[int]:
            raise NotImplementedError("scale_8b's rows are token ids; nothing is encoded")

        def decode(self, *args, **kwargs) -> str:
            raise NotImplementedError("scale_8b's rows are token ids; nothing is decoded")

        def get_vocab_size(self) -> int:
            return self.vocab

    class Rows(torch.utils.data.IterableDataset):
        def __init__(self, docs, order, seq_len: int):
            self.docs, self.order, self.seq_len = docs, order, seq_len

        def __iter__(self):
            for inputs, labels in stream_rows(self.docs, self.order, self.seq_len):
                yield {"input": torch.from_numpy(inputs)}, torch.from_numpy(labels)

    def vocab_of(job_config) -> int:
        return base.model_args[job_config.model.flavor].vocab_size

    def build_tokenizer(job_config, **_):
        return EndOfTextOnly(vocab_of(job_config))

    def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config, **_):
        training = job_config.training
        _, docs = documents(
            options.data_distribution, options.data_examples, options.data_max_length, vocab_of(job_config),
            options.data_seed,
        )  # fmt: skip
        order = rank_order(len(docs), dp_rank, dp_world_size, options.data_seed)
        if dp_rank == 0 and options.data_stats:
            rows = stream_rows(docs, order, training.seq_len)
            first = [next(rows)[0] for _ in range(training.steps * training.local_batch_size)]
            stats = {
                "rows": len(first),
                "seq_len": training.seq_len,
                "documents": [n for row in first for n in row_documents(row, tokenizer.eos_id)],
                "eos_id": tokenizer.eos_id,
                "distribution": options.data_distribution,
                "token_checksum": int(sum(int(np.asarray(r, dtype=np.int64).sum()) for r in first)),
            }
            options.data_stats.parent.mkdir(parents=True, exist_ok=True)
            options.data_stats.write_text(json.dumps(stats))
        return ParallelAwareDataloader(
            Rows(docs, order, training.seq_len), dp_rank=dp_rank, dp_world_size=dp_world_size,
            batch_size=training.local_batch_size,
        )  # fmt: skip

    spec = dataclasses.replace(
        base, build_tokenizer_fn=build_tokenizer, build_dataloader_fn=build_dataloader, build_validator_fn=None
    )
    register_train_spec(SPEC, spec)


def main(argv: list[str] | None = None) -> None:
    options, titan_args = _options(sys.argv[1:] if argv is None else argv)
    # torchtitan's ConfigManager reads sys.argv[1:] as its default argument when its module is imported: set it first
    sys.argv = [sys.argv[0], *titan_args, "--model.name", SPEC]
    _stub_missing_tensorboard()
    if options.cpu:
        _point_at_cpu()
    register(options)
    from torchtitan.train import Trainer
    from torchtitan.train import main as titan_main

    titan_main(Trainer)


if __name__ == "__main__":
    main()
