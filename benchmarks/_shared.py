"""What every benchmark script shares: the standard data, the model, timing and result files.

The scripts live in ``cpu/`` (run anywhere, write ``results/<name>.md`` and ``.json``) and ``gpu/``
(need CUDA, most have a ``--smoke`` CPU check); none imports another (a ``_`` module beside a script is
part of it: ``cpu/_offline_jobs.py``, ``gpu/_fa4_exactness.py``, ``gpu/_throughput_report.py``). Each puts
this folder on ``sys.path`` and imports from here:

- data: ``lengths_of`` (the standard length distributions, from ``_lengths.py``, which the tests
  import too), ``markov_tokens`` (token ids whose loss curve has a known floor) and ``markov_examples``
  (``_architectures.py`` beside it: every causal LM as a tiny model, for ``scripts/architecture_sweep.py``
  and the tests);
- model: ``SIZES``, ``model_config`` (Llama, Qwen2 or Mistral) and ``build_model`` (random weights),
  ``padded_batch``, ``to_device`` and ``sync``;
- timing: ``alternate`` + ``median`` (CPU, wall clock), ``median_round`` (a GPU mode's median
  round), ``train_step`` (one timed GPU step) and ``StepClock`` (a Trainer's step ends and forward times);
- PackingTrainer runs: ``add_trainer_options``, ``training_arguments`` (+ ``FSDP2``), ``trained``
  (a run's timed tokens, seconds, losses, probe), ``loss_gap`` and ``gather_ranks``;
- results: ``machine``, ``command``, ``write_results`` (into ``benchmarks/results/`` or a folder),
  ``write_run`` and ``peak_rss_mib`` (a process's own peak memory); ``CompileCounter`` (FA4's compiles).

torch and transformers are imported inside the functions that need them, so the CPU benchmarks
of torch-free code (and ``cpu/bench_offline.py``'s peak-memory children) do not load torch.
"""

from __future__ import annotations

import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"

# ----------------------------------------------------------------------------- data
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _lengths: tests import the same module
from _lengths import DISTRIBUTIONS, LONG_CONTEXT, lengths_of  # noqa: E402, F401


def markov_tokens(lengths: np.ndarray, vocab: int, seed: int) -> list[np.ndarray]:
    """One token array per example, drawn from a fixed chain where each token has 4 successors.

    The loss curves then mean something: their floor is ln 4 = 1.386.
    """
    rng = np.random.default_rng(seed)
    successors = np.random.default_rng(1234).integers(0, vocab, size=(vocab, 4))
    width = int(lengths.max())
    grid = np.empty((len(lengths), width), dtype=np.int64)
    grid[:, 0] = rng.integers(0, vocab, len(lengths))
    choice = rng.integers(0, 4, size=(len(lengths), width))
    for t in range(1, width):
        grid[:, t] = successors[grid[:, t - 1], choice[:, t]]
    return [grid[i, :n] for i, n in enumerate(lengths)]


def markov_examples(args) -> tuple[np.ndarray, list[dict]]:
    """``args.examples`` lengths of ``args.distribution`` (at most ``args.max_length``) and their examples."""
    lengths = np.minimum(lengths_of(args.distribution, args.examples, seed=0), args.max_length)
    return lengths, [{"input_ids": e} for e in markov_tokens(lengths, args.vocab, seed=0)]


# ----------------------------------------------------------------------------- model and batches
SIZES = {  # hidden, layers, heads, kv_heads, intermediate
    "tiny": (64, 2, 4, 2, 128),
    "200m": (1024, 12, 16, 4, 2816),
    "1b": (2048, 16, 32, 8, 5632),
}


def model_config(dims: tuple, vocab: int, *, arch: str = "llama", **extra):
    """A Llama-style config (``arch`` "qwen2" or "mistral": theirs) of ``dims`` = (hidden, layers, heads, kv heads,
    MLP), no KV cache, untied embeddings; ``extra`` sets any other field (``max_position_embeddings``)."""
    import transformers

    hidden, layers, heads, kv, inter = dims
    kind = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}[arch]
    return getattr(transformers, kind)(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        use_cache=False,
        tie_word_embeddings=False,
        **extra,
    )


def build_model(args, attn: str, device, dtype, dims: tuple | None = None):
    """A Llama-style model of ``args.size`` (or ``dims``; random weights, seeded by ``args.seed``) on ``device``, with
    ``attn`` (this library's packing_varlen / packing_fa4 registered first)."""
    import torch
    from transformers import LlamaForCausalLM

    positions = max(args.max_length, 8192)
    config = model_config(dims or SIZES[args.size], args.vocab, max_position_embeddings=positions)
    torch.manual_seed(args.seed)
    with torch.device(device):  # initialise on the GPU: seconds instead of a minute on the CPU
        model = LlamaForCausalLM(config).to(dtype=dtype)
    if attn in ("packing_varlen", "packing_fa4"):  # the library's backends: registered before the first forward
        from packing_collators import register_fa4_attention, register_varlen_attention

        (register_varlen_attention if attn == "packing_varlen" else register_fa4_attention)()
    model.config._attn_implementation = attn
    model.train()
    return model


def padded_batch(features: list[dict], multiple: int = 64) -> dict:
    """Right-padded to the longest example, rounded up to a multiple of 64 as careful users do
    (`pad_to_multiple_of=64`): without it every batch has a new shape and cuDNN attention
    re-plans each time, which made padding ~10x slower still in a first H200 run."""
    import torch

    width = -(-max(len(f["input_ids"]) for f in features) // multiple) * multiple
    ids = torch.zeros(len(features), width, dtype=torch.long)
    labels = torch.full((len(features), width), -100, dtype=torch.long)
    mask = torch.zeros(len(features), width, dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.as_tensor(f["input_ids"])
        labels[i, :n] = ids[i, :n]
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def sync(device) -> None:
    """Wait for the GPU's queued work (nothing on the CPU)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def to_device(batch: dict, device) -> dict:
    import torch

    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ----------------------------------------------------------------------------- timing
def alternate(contenders: dict, repeats: int) -> dict[str, list[float]]:
    """Run each callable once per round, in alternating order; seconds per call, per contender."""
    times = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else reversed(names):
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


median = statistics.median


def median_round(rounds: list[dict]) -> dict:
    """The round with the median real tokens/s (the lower middle of an even count, all its numbers),
    plus every round's tokens/s in ``rounds_tokens_per_s`` (gpu/train_throughput.py's rounds)."""
    ranked = sorted(rounds, key=lambda r: r["real_tokens_per_s"])
    return {**ranked[(len(ranked) - 1) // 2], "rounds_tokens_per_s": [r["real_tokens_per_s"] for r in rounds]}


def train_step(model, optimizer, batch: dict) -> float:
    """Seconds of one synchronised forward + backward + optimizer step on a device batch."""
    import torch

    torch.cuda.synchronize()
    started = time.perf_counter()
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.perf_counter() - started


class StepClock:
    """Wall time at each Trainer optimizer step's end (after a sync) in ``ends``; given a model, also
    each forward's time (CUDA events, no sync) in ``forwards`` and their count at each step end in ``marks``."""

    def __init__(self, cuda: bool, model=None):
        self.cuda, self.ends, self.marks, self.forwards, self._start = cuda, [], [], [], None
        if model is not None:
            model.register_forward_pre_hook(lambda *_: setattr(self, "_start", self._now()))
            model.register_forward_hook(lambda *_: self.forwards.append((self._start, self._now())))

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def forward_seconds(self, first: int, last: int) -> float:
        spans = self.forwards[first:last]
        return sum(a.elapsed_time(b) / 1e3 if self.cuda else b - a for a, b in spans)

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class StepEnd(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if clock.cuda:
                    import torch

                    torch.cuda.synchronize()
                clock.ends.append(time.perf_counter())
                clock.marks.append(len(clock.forwards))

        return StepEnd()


# ----------------------------------------------------------------------------- PackingTrainer runs
FSDP2 = {
    "fsdp": "full_shard auto_wrap",
    "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
}


def add_trainer_options(parser, *, examples: int, steps: int | None, warmup: int) -> None:
    """The options of the PackingTrainer harnesses (gpu/distributed.py): model, data, steps."""
    add = parser.add_argument
    add("--size", choices=sorted(SIZES), default="200m", help="the model (SIZES)")
    add("--distribution", default="sft", help="the examples' standard length distribution")
    add("--attn", default="packing_varlen")
    add("--tokens-per-batch", type=int, default=16384)
    add("--max-length", type=int, default=2048)
    add("--examples", type=int, default=examples)
    add("--vocab", type=int, default=32000)
    add("--steps", type=int, default=steps, help="timed steps, after --warmup")
    add("--warmup", type=int, default=warmup)
    add("--lr", type=float, default=3e-4)
    add("--seed", type=int, default=0)
    add("--smoke", action="store_true", help="tiny float32 model, sdpa, gloo (CPU check)")


def training_arguments(args, cuda: bool, **extra):
    """TrainingArguments of a timed run: ``args.warmup + args.steps`` steps of one batch at constant ``args.lr``, a
    log line per step, no checkpoints, fused AdamW on CUDA; ``extra`` adds or replaces any (``FSDP2``, ``bf16``)."""
    import tempfile

    from transformers import TrainingArguments

    options = dict(
        output_dir=tempfile.mkdtemp(prefix="bench_"),
        max_steps=args.warmup + args.steps,
        per_device_train_batch_size=1,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        optim="adamw_torch_fused" if cuda else "adamw_torch",
        use_cpu=not cuda,
        disable_tqdm=True,
        dataloader_pin_memory=cuda,
        ddp_find_unused_parameters=False,
        ddp_broadcast_buffers=False,
    )
    return TrainingArguments(**{**options, **extra})


def trained(trainer, clock: StepClock, lengths: np.ndarray, warmup: int, accumulation: int = 1) -> dict:
    """Train; then this rank's real tokens, seconds and forward seconds over the steps after ``warmup``, its losses,
    peak memory and steps, and the probe's report (None where no probe ran)."""
    import torch

    trainer.train()
    steps, first = trainer.state.global_step, warmup - 1
    timed = list(trainer._train_batch_sampler)[warmup * accumulation : steps * accumulation]
    callbacks = trainer.callback_handler.callbacks
    return {
        "tokens": float(sum(int(lengths[b].sum()) for b in timed)),
        "seconds": clock.ends[-1] - clock.ends[first],
        "forward_seconds": clock.forward_seconds(clock.marks[first], clock.marks[-1]),
        "loss": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
        "steps": steps,
        "probe": next((c.last_report for c in callbacks if getattr(c, "last_report", None)), None),
    }


def loss_gap(losses, reference) -> float:
    """Largest relative difference per step of two loss curves (same weights, data and steps)."""
    return float(max(abs(x - y) / max(abs(y), 1e-9) for x, y in zip(losses, reference)))


def gather_ranks(numbers: list[float], world: int, device) -> list:
    """Every rank's ``numbers`` (float64 tensors on the CPU), in rank order."""
    import torch

    local = torch.tensor(numbers, dtype=torch.float64, device=device)
    if world == 1:
        return [local.cpu()]
    import torch.distributed as dist

    parts = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(parts, local)
    return [p.cpu() for p in parts]


# ----------------------------------------------------------------------------- results
def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited from the forking parent)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    return f"{platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}"


def command() -> str:
    """The command line that reproduces this run, from the repository root."""
    script = Path(sys.argv[0]).resolve().relative_to(Path(__file__).resolve().parent.parent)
    return " ".join(["python", str(script), *sys.argv[1:]])


def write_results(name: str, markdown: str | None, data: dict, folder: Path = RESULTS) -> None:
    """Write <folder>/<name>.md (unless ``markdown`` is None) and <folder>/<name>.json and say where."""
    folder.mkdir(parents=True, exist_ok=True)
    if markdown is not None:
        (folder / f"{name}.md").write_text(markdown)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nwrote {folder / name}{'.md and ' if markdown is not None else ''}.json")


def write_run(folder: Path, name: str, result: dict) -> None:
    """One run's <folder>/<name>.json, and the result but its losses printed."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "loss"}, indent=1))


class CompileCounter:
    """FA4's compiled kernels so far (entries of flash_attn.cute's JIT caches) and the time spent compiling.

    ``count`` reads the caches themselves (``compile_cache`` of the interface's kernels), so it
    counts every compile however it was invoked; ``seconds`` times ``cutlass.cute.compile`` calls.
    Both stay 0 where FA4 is not installed.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._interface = None
        try:
            import cutlass.cute as cute
            import flash_attn.cute  # noqa: F401  (its import replaces cute.compile: wrap after it)
            import flash_attn.cute.interface as interface
        except ImportError:
            return
        self._interface, original = interface, cute.compile

        def timed_compile(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        cute.compile = timed_compile

    @property
    def count(self) -> int:
        if self._interface is None:
            return 0
        caches = [getattr(v, "compile_cache", None) for v in vars(self._interface).values()]
        return sum(
            len(getattr(c, "cache", c)) for c in caches if c is not None and hasattr(getattr(c, "cache", c), "__len__")
        )

    def snapshot(self) -> tuple[int, float]:
        return self.count, self.seconds
