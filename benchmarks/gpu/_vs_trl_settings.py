"""vs_trl.py's settings: the model, the data, and each setting's trainer, built as a user of each library would.

    BUILDERS[setting](args, model, dataset) -> (trainer, what it is)     described() after training: what ran

TRL's settings use only SFTConfig / SFTTrainer (its own packing, collator and loss); ours use PackingTrainer or the
stock Trainer with FlatteningCollator. ``trl_auto_cap``'s max_length comes from ``trl_budget``: this library's
``fit_token_budget`` driven by TRL's own training step (``trl_step_peak``), see vs_trl.py's docstring.
"""

from __future__ import annotations

import math
import tempfile

import numpy as np
from _lengths import lengths_of

DIMS = {"1b": (2048, 16, 32, 8, 8192), "smoke": (64, 2, 4, 2, 128)}  # hidden, layers, heads, kv heads, MLP
FAMILY = {  # which examples a setting needs: as many as its pair's steps use
    "trl_padding_free": "batch",
    "ours_flattening": "batch",
    "trl_bfd": "budget",
    "ours_packing": "budget",
    "ours_auto": "auto",
    "trl_auto_cap": "auto",
}
TRL_LOSS = "TRL fused LM head"  # SFTTrainer.compute_loss: log-probs a tile of tokens at a time, no full logits
STATES_PER_PARAMETER = 2  # AdamW's exp_avg and exp_avg_sq, counted as ours_auto counts them


def build_model(args, device):
    """The seeded Llama-style model (1B, or the smoke shape) on ``device``: float32 init, then bf16 on a GPU."""
    import torch
    from _shared import model_config
    from transformers import LlamaForCausalLM

    config = model_config(DIMS["smoke" if args.smoke else "1b"], args.vocab, max_position_embeddings=4096)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model = model.to(torch.float32 if args.smoke else torch.bfloat16)
    model.set_attn_implementation(args.attn)
    return model.train()


def mean_length(args) -> float:
    return float(example_lengths(args, 100_000).mean())


def example_lengths(args, n: int) -> np.ndarray:
    """``n`` lengths of ``args.distribution`` (smoke: an eighth of them, at least 4), seeded."""
    lengths = lengths_of(args.distribution, n, seed=args.seed)
    return np.maximum(4, lengths // 8) if args.smoke else lengths


def examples_needed(args, setting: str) -> int:
    """Enough examples for the setting's steps (the same count for both settings of a pair), with some spare."""
    if args.examples:
        return args.examples
    family = FAMILY[setting]
    steps = args.warmup + (args.auto_steps if family == "auto" else args.steps)
    if family == "batch":
        return math.ceil(1.1 * steps * args.batch_size)
    tokens = args.budget if family == "budget" else args.auto_tokens_guess
    return math.ceil(1.15 * steps * tokens / mean_length(args))


def make_dataset(args, n: int):
    """A ``datasets.Dataset`` of ``n`` examples: input_ids uniform over the vocabulary, labels = input_ids."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    lengths = example_lengths(args, n)
    values = np.random.default_rng(args.seed + 1).integers(0, args.vocab, int(lengths.sum()), dtype=np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    ids = pa.ListArray.from_arrays(offsets, pa.array(values))
    return datasets.Dataset(InMemoryTable(pa.table({"input_ids": ids, "labels": ids})))


def tiny_tokenizer():
    """The processing_class TRL requires (it reads its pad token): three words, built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def training_kwargs(args, cuda: bool, steps: int) -> dict:
    """What every setting's TrainingArguments / SFTConfig share (the batch size and TRL's options come apart)."""
    return dict(
        output_dir=tempfile.mkdtemp(prefix="vs_trl_"),
        max_steps=args.warmup + steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        optim=args.optim,
        bf16=cuda,
        gradient_checkpointing=args.gc,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        use_cpu=not cuda,
        disable_tqdm=True,
        dataloader_pin_memory=cuda,
        **compile_kwargs(args, cuda),
    )


def compile_kwargs(args, cuda: bool) -> dict:
    """``torch_compile=True`` under ``--torch-compile on`` (Inductor on a GPU, aot_eager's graphs on the CPU)."""
    if args.torch_compile != "on":
        return {}
    return {"torch_compile": True, "torch_compile_backend": "inductor" if cuda else "aot_eager"}


def _on_cuda(model) -> bool:
    return next(model.parameters()).device.type == "cuda"


def _longest(dataset) -> int:
    import pyarrow.compute as pc

    return int(pc.max(pc.list_value_length(dataset.data.column("input_ids"))).as_py())


# ----------------------------------------------------------------------------- TRL
def trl_trainer(args, model, dataset, steps: int, **options):
    """TRL's SFTTrainer as a user builds it: SFTConfig (the shared options + ``options``), a tokenized dataset."""
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(**training_kwargs(args, _on_cuda(model), steps), **options)
    return SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tiny_tokenizer())


def trl_bfd(args, model, dataset):
    bfd = dict(packing=True, packing_strategy="bfd", max_length=args.budget, per_device_train_batch_size=1)
    trainer = trl_trainer(args, model, dataset, args.steps, **bfd)
    rows = len(trainer.train_dataset)
    return trainer, {"max_length": args.budget, "padding_free": trainer.padding_free, "rows": rows}


def trl_padding_free(args, model, dataset):
    options = dict(padding_free=True, max_length=None, per_device_train_batch_size=args.batch_size)
    trainer = trl_trainer(args, model, dataset, args.steps, **options)
    return trainer, {"batch_size": args.batch_size, "padding_free": trainer.padding_free}


def trl_step_peak(trainer, tokens: int, longest: int) -> int | None:
    """Peak CUDA bytes of TRL's own step (its collator's batch, ``compute_loss``, backward) on one bfd row of
    ``tokens`` tokens in examples of ``longest``; None: out of memory. As the library's dry run: two passes with
    AdamW's states made between them, their bytes left out (the caller adds them), the gradients then freed."""
    import torch

    model = trainer.model
    device = next(model.parameters()).device
    lengths = [longest] * (tokens // longest) + ([tokens % longest] if tokens % longest else [])
    ids = torch.randint(0, model.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    batch = trainer.data_collator([{"input_ids": ids, "labels": ids, "seq_lengths": lengths}])
    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
    trainable, states = [p for p in model.parameters() if p.requires_grad], []
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)

    def step() -> None:  # the forward under the Trainer's bf16 autocast, the backward outside it
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = trainer.compute_loss(model, dict(batch))
        loss.backward()

    try:
        step()
        states = [torch.empty_like(p) for p in trainable for _ in range(STATES_PER_PARAMETER)]
        model.zero_grad(set_to_none=True)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device)) - sum(t.numel() * t.element_size() for t in states)
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        batch.clear()  # the row's tensors and the states freed before the cache is emptied
        states.clear()
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def trl_budget(args, model, dataset):
    """The largest bfd max_length whose TRL step fits ``args.memory_fraction`` of the card (a ``TokenBudget``)."""
    import torch

    from packing_collators.budget import fit_token_budget
    from packing_collators.budget import avoid_fragmentation
    from packing_collators._gpu_memory import usable_gpu_bytes

    if not _on_cuda(model):
        raise SystemExit("trl_auto_cap measures GPU memory: it needs a CUDA GPU (it has no --smoke form).")
    avoid_fragmentation(model.device)  # as ours_auto's measure_token_budget does: the same allocator on both sides
    few = dataset.select(range(min(len(dataset), 64)))  # the measuring trainer's own rows are never trained
    probe = trl_trainer(args, model, few, args.auto_steps, packing=True, max_length=args.budget)
    if args.gc:  # as Trainer.train() will turn it on
        from packing_collators._compat import enable_activation_checkpointing

        enable_activation_checkpointing(model, {"use_reentrant": False})
    trainable = [p for p in model.parameters() if p.requires_grad]
    longest = _longest(dataset)
    budget = fit_token_budget(
        lambda tokens: trl_step_peak(probe, tokens, longest),
        longest=longest,
        total_bytes=usable_gpu_bytes(model.device),  # as ours_auto's: a --memory-cap-gib counted
        optimizer_bytes=STATES_PER_PARAMETER * sum(p.numel() * p.element_size() for p in trainable),
        memory_fraction=args.memory_fraction,
    )
    print(f"trl_auto_cap: {budget.summary()}", flush=True)
    return budget


def trl_auto_cap(args, model, dataset):
    budget = trl_budget(args, model, dataset)
    length = budget.max_tokens_per_batch
    options = dict(packing=True, packing_strategy="bfd", max_length=length, per_device_train_batch_size=1)
    trainer = trl_trainer(args, model, dataset, args.auto_steps, **options)
    about = {"max_length": length, "budget": budget.summary(), "padding_free": trainer.padding_free}
    return trainer, {**about, "rows": len(trainer.train_dataset)}


# ----------------------------------------------------------------------------- ours
def packing_trainer(args, model, dataset, steps: int, budget):
    from transformers import TrainingArguments

    from packing_collators import PackingTrainer

    arguments = TrainingArguments(**training_kwargs(args, _on_cuda(model), steps), per_device_train_batch_size=1)
    return PackingTrainer(
        model=model,
        args=arguments,
        train_dataset=dataset,
        max_tokens_per_batch=budget,
        loss_implementation=args.loss_implementation,
        **({"compile_layers": False} if args.torch_compile == "off" else {}),  # defaults: its "auto"
    )


def ours_packing(args, model, dataset):
    return packing_trainer(args, model, dataset, args.steps, args.budget), {"max_tokens_per_batch": args.budget}


def ours_auto(args, model, dataset):
    if not _on_cuda(model):
        raise SystemExit("ours_auto measures GPU memory: it needs a CUDA GPU (it has no --smoke form).")
    return packing_trainer(args, model, dataset, args.auto_steps, "auto"), {}


def ours_flattening(args, model, dataset):
    """The stock Trainer, FlatteningCollator, and the one documented line before it (where this version has it)."""
    from transformers import Trainer, TrainingArguments

    import packing_collators
    from packing_collators import FlatteningCollator

    chunked = getattr(packing_collators, "enable_chunked_loss", None)
    if args.loss_implementation == "full":
        loss = "full logits (--loss-implementation full)"
    elif chunked is None:
        loss = "full logits (this version has no enable_chunked_loss)"
    else:
        chunked(model)
        loss = "enable_chunked_loss"
    kwargs = training_kwargs(args, _on_cuda(model), args.steps)
    if args.compiled:  # the stock Trainer compiles the whole model; the documented line compiles the layers
        from packing_collators import choose_attention, compile_layers

        if _on_cuda(model):  # FA4 as one graph node: the library's custom op around the same kernel
            choose_attention(model, "packing_fa4")
        backend = kwargs.pop("torch_compile_backend", None) or ("inductor" if _on_cuda(model) else "aot_eager")
        compile_layers(model, backend=backend)
        kwargs.pop("torch_compile", None)
        loss += " + compile_layers"
    arguments = TrainingArguments(**kwargs, per_device_train_batch_size=args.batch_size)
    trainer = Trainer(model=model, args=arguments, train_dataset=dataset, data_collator=FlatteningCollator())
    return trainer, {"batch_size": args.batch_size, "loss": loss}


BUILDERS = {
    "trl_padding_free": trl_padding_free,
    "ours_flattening": ours_flattening,
    "trl_bfd": trl_bfd,
    "ours_packing": ours_packing,
    "ours_auto": ours_auto,
    "trl_auto_cap": trl_auto_cap,
}


def described(trainer, setting: str, about: dict) -> dict:
    """What ran, read after training: the attention, the loss, ours' budget (measured, for ours_auto)."""
    about = {**about, "attention": trainer.model.config._attn_implementation}
    if setting.startswith("trl"):
        about["loss"] = TRL_LOSS
    elif setting != "ours_flattening":
        heads = getattr(getattr(trainer, "_head_loss", None), "heads", {})
        about["loss"] = "PackingTrainer chunked" if any(h is not None for h in heads.values()) else "full logits"
        measured = getattr(getattr(trainer, "_budget", None), "_auto", None)  # TrainerBudget: "auto", once measured
        about["max_tokens_per_batch"] = measured or about.get("max_tokens_per_batch")
        report = getattr(trainer, "compile_report", None)
        about["compile"] = None if report is None else report.summary()
    return about
