"""Offline defaults of the example scripts, nothing downloaded: ``python-docs``, question/answer
conversations from the public docstrings of this Python's standard library (read with ``ast``),
a 4,096-token byte-level BPE trained on them (ChatML template), and ``tiny-llama``, a 4-layer
Llama built from a config. Other ``--dataset`` (.json/.jsonl/.parquet files, or a hub name) and
``--model`` names load as usual. Built once (about 15 s) into ``examples/.cache/`` (or
``$PACKING_EXAMPLES_CACHE``); delete it to rebuild. Copy this file beside an example you copy.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

OFFLINE_MODEL, OFFLINE_DATASET = "tiny-llama", "python-docs"
CACHE = Path(os.environ.get("PACKING_EXAMPLES_CACHE", Path(__file__).resolve().parent / ".cache"))
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SKIPPED = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "pydoc_data", "site-packages", "dist-packages", "__phello__", "encodings"}  # fmt: skip
QUESTIONS = {
    "module": ["What is the Python module `{name}` for?", "Explain what `{name}` in the standard library provides."],
    "class": ["What is the class `{name}` in Python's standard library?", "Describe `{name}`.", "When would I use `{name}`?"],
    "function": ["What does `{name}({args})` do?", "Explain `{name}({args})`.", "How do I use `{name}`? Its signature is `{name}({args})`."],
}  # fmt: skip


def _cache(name: str) -> Path:
    return CACHE / f"python{sys.version_info.major}.{sys.version_info.minor}-v1" / name


def _write(path: Path, text: str) -> None:
    """Write through a temporary file, so two processes building at once never read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (tmp := path.with_suffix(f".{os.getpid()}.tmp")).write_text(text, encoding="utf-8")
    tmp.replace(path)


def _documented(tree, module: str) -> list[tuple[str, str, str, str]]:
    """(kind, name, args, docstring) of a module and its public classes and functions, 40+ characters each."""
    found = [("module", module, "", ast.get_docstring(tree) or "")]

    def visit(node, prefix: str) -> None:
        for child in node.body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not child.name.startswith("_"):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                args = "" if kind == "class" else ast.unparse(child.args)
                found.append((kind, f"{prefix}.{child.name}", args, ast.get_docstring(child) or ""))
                if kind == "class":
                    visit(child, f"{prefix}.{child.name}")

    visit(tree, module)
    return [(kind, name, args, doc) for kind, name, args, doc in found if len(doc) >= 40]


def _conversation(kind: str, name: str, args: str, doc: str, module: str) -> dict:
    choices = QUESTIONS[kind]
    question = choices[int(hashlib.md5(name.encode()).hexdigest(), 16) % len(choices)].format(name=name, args=args)
    if len(doc) > 2000:  # cut at a paragraph boundary
        cut = doc.rfind("\n\n", 0, 2000)
        doc = doc[: cut if cut > 500 else 2000].rstrip()
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": doc}], "source": module}


def python_docs_file() -> Path:
    """The ``python-docs`` conversations as a jsonl file, built on first use."""
    path = _cache("python_docs.jsonl")
    if path.exists():
        return path
    root, rows = Path(sysconfig.get_paths()["stdlib"]), []
    for file in sorted(root.rglob("*.py")):
        parts = file.relative_to(root).parts
        module = ".".join(file.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        if not SKIPPED.isdisjoint(parts) or parts[0].startswith("config-") or "._" in f".{module}":
            continue
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        rows += [_conversation(*found, module) for found in _documented(tree, module)]
    _write(path, "".join(json.dumps(row) + "\n" for row in rows))
    print(f"built {len(rows):,} python-docs conversations -> {path}", flush=True)
    return path


def load_conversations(names: list[str] | str, split: str = "train", max_examples: int | None = None):
    """A ``datasets.Dataset`` with ``messages`` (or ``prompt``/``completion``): python-docs, local files or the hub."""
    import datasets

    names = [str(python_docs_file())] if names in (OFFLINE_DATASET, [OFFLINE_DATASET]) else list(names)
    if all(Path(n).exists() for n in names):
        builder = "parquet" if {Path(n).suffix for n in names} == {".parquet"} else "json"
        dataset = datasets.load_dataset(builder, data_files=names, split="train")
    else:
        dataset = datasets.load_dataset(names[0], split=split)  # a hub dataset: only when named
    dataset = dataset.select(range(min(max_examples, len(dataset)))) if max_examples is not None else dataset
    if "messages" not in dataset.column_names and not {"prompt", "completion"} <= set(dataset.column_names):
        raise ValueError(f"The dataset has columns {dataset.column_names}; it needs 'messages' or 'prompt' and 'completion'.")
    return dataset


def hub_options(name: str) -> dict:
    """``from_pretrained`` keywords for ``name``, or a ConnectionError now for a Hub name out of reach (offline and not
    cached, or no answer to one HEAD request in 3 s), where the loaders would retry for 25-50 s first."""
    from huggingface_hub import constants, get_session

    if Path(name).expanduser().exists():
        return {}
    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}" / "snapshots"
    cached, fix = snapshots.is_dir() and any(snapshots.iterdir()), "Pass a folder saved with save_pretrained (--model PATH)"
    if constants.HF_HUB_OFFLINE:
        if not cached:
            raise ConnectionError(f"{name!r} is not a local folder, and HF_HUB_OFFLINE=1 forbids downloading it (it is not in the Hub cache). {fix}, or unset HF_HUB_OFFLINE where there is network.")  # fmt: skip
        return {}
    try:
        get_session().head(constants.ENDPOINT, timeout=3.0)
    except Exception as error:  # DNS, refused, timeout, proxy: from_pretrained would retry before failing
        if not cached:
            raise ConnectionError(f"{name!r} is not a local folder, and the Hub cannot be reached ({type(error).__name__}: {error}). {fix}, or connect this machine.") from None  # fmt: skip
        return {"local_files_only": True}
    return {}


def load_tokenizer(name: str):
    """The BPE trained on python-docs (``tiny-llama``), or a hub tokenizer with a chat template and a pad token."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if name != OFFLINE_MODEL:
        tokenizer = AutoTokenizer.from_pretrained(name, **hub_options(name))
        tokenizer.chat_template, tokenizer.pad_token = tokenizer.chat_template or CHATML, tokenizer.pad_token or tokenizer.eos_token
        return tokenizer
    path = _cache("tokenizer.json")
    if not path.exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        texts = (m["content"] for line in python_docs_file().open(encoding="utf-8") for m in json.loads(line)["messages"])
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        special, alphabet = ["<|pad|>", "<|im_start|>", "<|im_end|>"], pre_tokenizers.ByteLevel.alphabet()
        bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=4096, special_tokens=special, show_progress=False, initial_alphabet=alphabet))
        _write(path, bpe.to_str())
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path), pad_token="<|pad|>", bos_token="<|im_start|>", eos_token="<|im_end|>", chat_template=CHATML
    )


def load_model(name: str, tokenizer, *, attn_implementation: str = "sdpa", max_length: int = 512, seed: int = 0):
    """``tiny-llama`` in float32, or a hub model (bf16 on a GPU); ``use_cache=False``, as packed training needs."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from packing_collators import register_fa4_attention, register_varlen_attention

    if attn_implementation in ("packing_varlen", "packing_fa4"):  # this library's backends: registered by name first
        (register_varlen_attention if attn_implementation == "packing_varlen" else register_fa4_attention)()
    torch.manual_seed(seed)
    if name != OFFLINE_MODEL:
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        options = {"attn_implementation": attn_implementation, "dtype": dtype, **hub_options(name)}
        model = AutoModelForCausalLM.from_pretrained(name, **options)
        model.config.use_cache = False  # a cache during training switches packed-sequence masks off
        return model
    ids = {k: getattr(tokenizer, k) for k in ("pad_token_id", "bos_token_id", "eos_token_id")}
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max(max_length, 512), tie_word_embeddings=True, use_cache=False, **ids,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
