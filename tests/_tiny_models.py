"""Test helpers: tiny randomly initialised causal LMs, example batches, a reference varlen kernel.

Nothing is downloaded: models are built from configs. ``initializer_range=0.5``
makes attention sharp enough that letting one example see another changes the
loss far beyond the 1e-5 tolerance of the equivalence tests.
"""

from __future__ import annotations

import numpy as np
import torch

VOCAB = 128
ARCHITECTURES = ("llama", "qwen2", "mistral")


def tiny_config(arch: str = "llama", **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        initializer_range=0.5,
        use_cache=False,
        pad_token_id=0,
    )
    if arch == "llama":
        config = LlamaConfig(**{**common, **overrides})
    elif arch == "qwen2":
        config = Qwen2Config(**{**common, **overrides})
    elif arch == "mistral":  # a sliding window shorter than the examples, so windows are exercised
        config = MistralConfig(**{**common, "sliding_window": 5, **overrides})
    else:
        raise ValueError(f"unknown architecture {arch!r}")
    return config


def tiny_model(arch: str = "llama", *, attn: str = "sdpa", seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    return model.train()


def random_examples(lengths, *, seed: int = 0, completion_only: bool = False) -> list[dict]:
    """Examples with ``input_ids`` (and ``labels`` masking a prompt half when ``completion_only``)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = rng.integers(1, VOCAB, size=n).tolist()
        example = {"input_ids": ids}
        if completion_only:
            example["labels"] = [-100] * (n // 2) + ids[n // 2 :]
        out.append(example)
    return out


def padded_batch(examples: list[dict]) -> dict:
    """Right-padded batch: attention_mask, labels -100 on pads (what DataCollatorForSeq2Seq makes)."""
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros(len(examples), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = torch.tensor(e["input_ids"])
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(e.get("labels", e["input_ids"]))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def reference_varlen_attn(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
    num_splits=None,
    is_causal=None,
):
    """``varlen_attn`` semantics on CPU: per-segment sdpa with the (left, right) window as a mask."""
    if is_causal is not None:  # the older keyword
        window_size = (-1, 0) if is_causal else (-1, -1)
    assert cu_seq_q.dtype == torch.int32 and isinstance(max_q, int) and isinstance(max_k, int)
    if key.shape[1] != query.shape[1]:
        assert enable_gqa, "k/v with fewer heads than q need enable_gqa=True"
        key, value = (x.repeat_interleave(query.shape[1] // x.shape[1], dim=1) for x in (key, value))
    out = torch.empty_like(query)
    bounds = cu_seq_q.tolist()
    assert bounds == cu_seq_k.tolist() and max(np.diff(bounds)) == max_q
    left, right = window_size
    for start, end in zip(bounds[:-1], bounds[1:]):
        n = end - start
        pos = torch.arange(n)
        delta = pos[:, None] - pos[None, :]  # q - k
        allowed = torch.ones(n, n, dtype=torch.bool)
        if left >= 0:
            allowed &= delta <= left
        if right >= 0:
            allowed &= -delta <= right
        q, k, v = (x[start:end].transpose(0, 1) for x in (query, key, value))
        out[start:end] = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, scale=scale
        ).transpose(0, 1)
    return out


def training_args(tmp_path, **overrides):
    """TrainingArguments for tiny CPU runs: 4 steps of 4 examples, accumulation 2, a log line per step."""
    from transformers import TrainingArguments

    options = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        max_steps=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    return TrainingArguments(**{**options, **overrides})


def causal_over_whole_row(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An attention function plainly causal over each whole row: it ignores cu_seq_lens, position_ids and masks."""
    groups = query.shape[1] // key.shape[1]
    key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None
