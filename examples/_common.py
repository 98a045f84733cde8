"""Shared plumbing of the example scripts: offline defaults, the SFT dataset, the summary.

Everything works offline. Unless ``--model`` / ``--dataset`` name something else:

- the dataset is ``python-docs``: question/answer conversations built from the docstrings
  of the Python standard library that ships with this interpreter (read with ``ast``,
  nothing imported), about 4,400 examples (Python 3.11) of real English with very uneven lengths;
- the tokenizer is a byte-level BPE (4,096 tokens) trained on that text with ``tokenizers``
  and wrapped as a ``PreTrainedTokenizerFast`` with a ChatML chat template;
- the model is ``tiny-llama``: a 4-layer Llama built from a config (random weights).

The dataset and tokenizer are built once (about 15 s) and cached in ``examples/.cache/``
(or ``$PACKING_EXAMPLES_CACHE``); delete the folder to rebuild them.

Tokenization is the library's :func:`packing_collators.tokenize_chat`: the chat template renders
the conversation, and only the assistant's tokens (each answer and its end-of-turn text) are
trained; every system, user and template token gets label -100::

    <|im_start|>user\\nWhat does `json.dumps(obj)` do?<|im_end|>\\n<|im_start|>assistant\\n | Serialize ...<|im_end|>\\n
    labels: -100 -100 ...                                                              | trained tokens
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

OFFLINE_MODEL = "tiny-llama"
OFFLINE_DATASET = "python-docs"
DATA_VERSION = 1  # bump when the dataset or tokenizer recipe changes
CACHE = Path(os.environ.get("PACKING_EXAMPLES_CACHE", Path(__file__).resolve().parent / ".cache"))
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
SKIPPED_STDLIB_DIRS = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "pydoc_data",
    "site-packages",
    "dist-packages",
    "__phello__",
    "encodings",
}
QUESTIONS = {
    "module": ["What is the Python module `{name}` for?", "Explain what `{name}` in the standard library provides."],
    "class": [
        "What is the class `{name}` in Python's standard library?",
        "Describe `{name}`.",
        "When would I use `{name}`?",
    ],
    "function": [
        "What does `{name}({args})` do?",
        "Explain `{name}({args})`.",
        "How do I use `{name}`? Its signature is `{name}({args})`.",
    ],
}


# ----------------------------------------------------------------------------- arguments


def add_common_args(parser: argparse.ArgumentParser, *, batch_size: int = 8) -> None:
    """The options every example script takes."""
    parser.add_argument(
        "--model",
        default=OFFLINE_MODEL,
        help=f"hub name or local path of a causal LM; '{OFFLINE_MODEL}' (default) builds a tiny random Llama offline",
    )
    parser.add_argument(
        "--dataset",
        default=OFFLINE_DATASET,
        nargs="+",
        help=f"hub name, or local .json/.jsonl/.parquet files with a 'messages' column (chat turns) "
        f"or 'prompt'/'completion'; '{OFFLINE_DATASET}' (default) builds conversations from "
        "the docstrings of this Python's standard library",
    )
    parser.add_argument("--split", default="train", help="dataset split (hub datasets)")
    parser.add_argument("--max-examples", type=int, default=None, help="use only the first N examples")
    parser.add_argument("--max-length", type=int, default=512, help="truncate examples to this many tokens")
    parser.add_argument("--batch-size", type=int, default=batch_size, help="examples per micro-batch (per process)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps (-1: epochs)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--attn-implementation",
        default="sdpa",
        help="sdpa (CPU or GPU), flash_attention_2/4, packing_varlen (the library's torch varlen kernel, GPU) or "
        "packing_fa4 (FlashAttention-4's kernel straight from the batch: Hopper/Blackwell)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument("--save-dir", default=None, help="save the fine-tuned model and tokenizer here")


# ----------------------------------------------------------------------------- offline dataset


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if SKIPPED_STDLIB_DIRS.isdisjoint(parts) and not parts[0].startswith("config-"):
            files.append(path)
    return files


def _trim(doc: str, limit: int = 2000) -> str:
    """The docstring, cut at a paragraph boundary if it is longer than ``limit`` characters."""
    if len(doc) <= limit:
        return doc
    cut = doc.rfind("\n\n", 0, limit)
    return doc[: cut if cut > limit // 4 else limit].rstrip()


def _question(kind: str, name: str, args: str) -> str:
    choices = QUESTIONS[kind]
    pick = int(hashlib.md5(name.encode()).hexdigest(), 16) % len(choices)
    return choices[pick].format(name=name, args=args)


def _conversations_of(path: Path, module: str) -> list[dict]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return []
    found = []

    def visit(node, prefix: str) -> None:
        for child in node.body:
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or child.name.startswith(
                "_"
            ):
                continue
            name = f"{prefix}.{child.name}"
            doc = ast.get_docstring(child)
            if doc and len(doc) >= 40:
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                args = "" if kind == "class" else ast.unparse(child.args)
                found.append((kind, name, args, doc))
            if isinstance(child, ast.ClassDef):
                visit(child, name)

    doc = ast.get_docstring(tree)
    if doc and len(doc) >= 40:
        found.append(("module", module, "", doc))
    visit(tree, module)
    return [
        {
            "messages": [
                {"role": "user", "content": _question(kind, name, args)},
                {"role": "assistant", "content": _trim(doc)},
            ],
            "source": module,
        }
        for kind, name, args, doc in found
    ]


def build_python_docs_conversations() -> list[dict]:
    """Question/answer conversations from the standard library's public docstrings (deterministic)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    conversations = []
    for path in _stdlib_files():
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        if any(part.startswith("_") for part in module.split(".")):
            continue
        conversations += _conversations_of(path, module)
    return conversations


def _cache_dir() -> Path:
    return CACHE / f"python{sys.version_info.major}.{sys.version_info.minor}-v{DATA_VERSION}"


def python_docs_file() -> Path:
    """The ``python-docs`` conversations as a jsonl file, built on first use."""
    path = _cache_dir() / "python_docs.jsonl"
    if not path.exists():
        start = time.perf_counter()
        print(f"Building the python-docs dataset from {sysconfig.get_paths()['stdlib']} ...", flush=True)
        rows = build_python_docs_conversations()
        _atomic_write(path, "".join(json.dumps(row) + "\n" for row in rows))
        print(f"  {len(rows):,} conversations in {time.perf_counter() - start:.1f} s -> {path}", flush=True)
    return path


def _atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file, so two processes building at once never read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def load_conversations(names: list[str] | str, split: str = "train", max_examples: int | None = None):
    """A ``datasets.Dataset`` with ``messages`` (or ``prompt``/``completion``) from files, the hub or python-docs."""
    import datasets

    names = [names] if isinstance(names, str) else list(names)
    if names == [OFFLINE_DATASET]:
        names = [str(python_docs_file())]
    suffixes = {Path(n).suffix for n in names}
    if all(Path(n).exists() for n in names):
        if not suffixes <= {".json", ".jsonl", ".parquet"} or len(suffixes) != 1:
            raise ValueError(f"Local dataset files must all be .json, .jsonl or .parquet; got {names}.")
        builder = "parquet" if suffixes == {".parquet"} else "json"
        dataset = datasets.load_dataset(builder, data_files=names, split="train")
    elif len(names) == 1:
        dataset = datasets.load_dataset(names[0], split=split)  # a hub dataset: only when named
    else:
        raise ValueError(f"Not found: {[n for n in names if not Path(n).exists()]}; pass local files or one hub name.")
    if max_examples is not None:
        dataset = dataset.select(range(min(max_examples, len(dataset))))
    if "messages" not in dataset.column_names and not {"prompt", "completion"} <= set(dataset.column_names):
        raise ValueError(
            f"The dataset has columns {dataset.column_names}; it needs 'messages' (a list of "
            "{'role', 'content'} turns) or 'prompt' and 'completion'."
        )
    return dataset


# ----------------------------------------------------------------------------- tokenizer and model


def offline_tokenizer():
    """A byte-level BPE trained on python-docs (cached), as a ``PreTrainedTokenizerFast`` with ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = _cache_dir() / "tokenizer.json"
    if not path.exists():
        start = time.perf_counter()
        texts = (
            m["content"] for line in python_docs_file().open(encoding="utf-8") for m in json.loads(line)["messages"]
        )
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=4096,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        bpe.train_from_iterator(texts, trainer)
        _atomic_write(path, bpe.to_str())
        print(
            f"  trained a {bpe.get_vocab_size():,}-token BPE in {time.perf_counter() - start:.1f} s -> {path}",
            flush=True,
        )
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path),
        pad_token="<|pad|>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        chat_template=CHATML,
    )


def load_tokenizer(name: str):
    if name == OFFLINE_MODEL:
        return offline_tokenizer()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHATML
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name: str, tokenizer, *, attn_implementation: str = "sdpa", max_length: int = 512, seed: int = 0):
    """The causal LM in float32 (bf16 on GPU for hub models), ``use_cache=False`` as packing needs."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if attn_implementation == "packing_varlen":
        from packing_collators import register_varlen_attention  # lands with the Trainer integration

        register_varlen_attention()
    if attn_implementation == "packing_fa4":
        from packing_collators import register_fa4_attention

        register_fa4_attention()
    torch.manual_seed(seed)
    if name == OFFLINE_MODEL:
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max(max_length, 512),
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            use_cache=False,
        )
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    else:
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=attn_implementation, dtype=dtype)
        model.config.use_cache = False  # a cache during training switches packed-sequence masks off
    return model


# ----------------------------------------------------------------------------- SFT tokenization


def sft_dataset(args, tokenizer):
    """The dataset named by ``--dataset`` and ``--max-examples`` as ``input_ids``/``labels``, cut to ``--max-length``.

    Assistant-only labels from :func:`tokenize_chat`; examples left with no trained token (a
    prompt of ``--max-length`` tokens or more) are dropped, and counted in its log line.
    """
    from packing_collators import tokenize_chat

    raw = load_conversations(args.dataset, args.split, args.max_examples)
    chat = ["messages"] if "messages" in raw.column_names else ["prompt", "completion"]
    return tokenize_chat(raw.select_columns(chat), tokenizer, max_length=args.max_length, overflow="truncate")


# ----------------------------------------------------------------------------- counting and the summary


def padded_slots(lengths, batch_size: int, seed: int = 0) -> int:
    """Token slots a padded run computes: batches of ``batch_size`` in random order, each padded to its longest.

    >>> padded_slots([5, 1, 2, 8], batch_size=2)
    26
    """
    lengths = np.asarray(lengths)
    order = np.random.default_rng(seed).permutation(len(lengths))
    return int(sum(len(b) * b.max() for b in np.array_split(lengths[order], range(batch_size, len(order), batch_size))))


class BatchCounter:
    """Wraps a collator and records, per batch, its examples' lengths, trained labels and computed slots."""

    def __init__(self, collate):
        self.collate = collate
        self.batches: list[tuple[np.ndarray, int, int]] = []

    def __call__(self, features):
        batch = self.collate(features)
        if "seq_lengths" in features[0]:  # pre-packed rows: one feature holds several examples
            lengths = np.concatenate([np.asarray(f["seq_lengths"]) for f in features])
        else:
            lengths = np.array([len(f["input_ids"]) for f in features])
        trained = int((batch["labels"] != -100).sum())
        self.batches.append((lengths, trained, int(batch["input_ids"].numel())))
        return batch

    def reset_on_train_begin(self):
        """A ``TrainerCallback`` that forgets batches collated before training (e.g. a check's probe batch)."""
        from transformers import TrainerCallback

        counter = self

        class Reset(TrainerCallback):
            def on_train_begin(self, *args, **kwargs):
                counter.batches.clear()

        return Reset()

    def totals(self, batch_size: int, num_batches: int | None = None, seed: int = 0) -> dict:
        """Sums over the first ``num_batches`` batches (those trained on: a DataLoader may fetch one more),
        summed over all processes when ``torch.distributed`` is initialised."""
        import torch
        import torch.distributed as dist

        seen = self.batches[:num_batches]
        lengths = np.concatenate([b[0] for b in seen]) if seen else np.zeros(0, np.int64)
        values = torch.tensor(
            [
                len(lengths),
                int(lengths.sum()),
                sum(b[1] for b in seen),
                sum(b[2] for b in seen),
                len(seen),
                padded_slots(lengths, batch_size, seed) if len(lengths) else 0,
            ]
        )
        if dist.is_available() and dist.is_initialized():  # NCCL reduces CUDA tensors only, gloo CPU ones
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
            values = values.to(device)
            dist.all_reduce(values)
            values = values.cpu()
        keys = ("examples", "tokens", "trained_tokens", "slots", "micro_batches", "padded_slots")
        return dict(zip(keys, values.tolist()))


def print_summary(
    title: str,
    totals: dict,
    *,
    dataset_examples: int,
    dataset_tokens: int,
    steps: int,
    seconds: float,
    final_loss: float,
    extra: dict | None = None,
) -> None:
    """The summary every example prints; ``tests/test_examples.py`` parses these lines."""
    tokens, slots, padded = totals["tokens"], totals["slots"], totals["padded_slots"]
    avoided = max(padded - slots, 0)
    lines = {
        "dataset": f"{dataset_examples:,} examples, {dataset_tokens:,} tokens",
        "examples": f"{totals['examples']:,}",
        "tokens": f"{tokens:,}",
        "trained tokens": f"{totals['trained_tokens']:,} (assistant tokens only; prompts masked)",
        "micro-batches": f"{totals['micro_batches']:,}",
        "optimizer steps": f"{steps:,}",
        "padded equivalent": f"{padded:,} token slots ({1 - tokens / padded:.1%} padding)",
        "padding waste avoided": f"{avoided:,} token slots ({avoided / padded:.1%})",
        "packing efficiency": f"{tokens / slots:.2%} ({tokens:,} tokens in {slots:,} slots)",
        "tokens/s": f"{tokens / seconds:,.0f} ({seconds:.1f} s)",
        "final loss": f"{final_loss:.4f}",
        **(extra or {}),
    }
    width = max(map(len, lines)) + 2
    print(f"\n== {title} ==")
    for key, value in lines.items():
        print(f"{key + ':':<{width}}{value}")


def training_arguments(args, **overrides):
    """``TrainingArguments`` from the common options (no checkpoints, no reporting)."""
    import torch
    from transformers import TrainingArguments

    defaults = dict(
        output_dir=str(CACHE / "runs"),
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
    )
    return TrainingArguments(**{**defaults, **overrides})


def train_and_summarize(title: str, trainer, counter: BatchCounter, args, dataset, extra: dict | None = None) -> None:
    """``trainer.train()``, then the summary (from rank 0) and, with ``--save-dir``, the model."""
    trainer.add_callback(counter.reset_on_train_begin())  # last: after the packing checks' probe batch
    result = trainer.train()
    state = trainer.state
    totals = counter.totals(args.batch_size, state.global_step * trainer.args.gradient_accumulation_steps, args.seed)
    losses = [entry["loss"] for entry in state.log_history if "loss" in entry]
    if args.save_dir:
        trainer.save_model(args.save_dir)
        trainer.processing_class.save_pretrained(args.save_dir)
    if trainer.is_world_process_zero():
        total, _ = dataset_tokens(dataset)
        print_summary(
            title,
            totals,
            dataset_examples=len(dataset),
            dataset_tokens=total,
            steps=state.global_step,
            seconds=result.metrics["train_runtime"],
            final_loss=losses[-1] if losses else result.training_loss,
            extra=extra,
        )


def dataset_tokens(dataset) -> tuple[int, np.ndarray]:
    """Total tokens and per-example lengths of a tokenized dataset."""
    from packing_collators import lengths_from_dataset

    lengths = np.asarray(lengths_from_dataset(dataset))
    return int(lengths.sum()), lengths
