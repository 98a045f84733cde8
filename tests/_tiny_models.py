"""Test helpers: tiny randomly initialised causal LMs, example batches, reference varlen and FA4 kernels,
and the loss-and-gradients comparison the equivalence tests share.

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
    bounds, key_bounds = cu_seq_q.tolist(), cu_seq_k.tolist()
    assert len(bounds) == len(key_bounds) and max(np.diff(bounds)) == max_q and max(np.diff(key_bounds)) == max_k
    left, right = window_size
    for start, end, k_start, k_end in zip(bounds[:-1], bounds[1:], key_bounds[:-1], key_bounds[1:]):
        # windows aligned bottom-right, as flash kernels align them: the last query meets the last key
        q_pos, k_pos = torch.arange(end - start) + (k_end - k_start) - (end - start), torch.arange(k_end - k_start)
        delta = q_pos[:, None] - k_pos[None, :]  # q - k
        allowed = torch.ones(end - start, k_end - k_start, dtype=torch.bool)
        if left >= 0:
            allowed &= delta <= left
        if right >= 0:
            allowed &= -delta <= right
        q = query[start:end].transpose(0, 1)
        k, v = (x[k_start:k_end].transpose(0, 1) for x in (key, value))
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


def _reference_fa4_probabilities(q, k, start, end, scale, left, right):
    """Attention probabilities (heads, n, n) of one segment, float32, k already repeated for GQA."""
    pos = torch.arange(end - start)
    delta = pos[:, None] - pos[None, :]
    allowed = torch.ones(end - start, end - start, dtype=torch.bool)
    if left >= 0:
        allowed &= delta <= left
    if right >= 0:
        allowed &= -delta <= right
    scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), k[start:end].float()) * scale
    return scores.masked_fill(~allowed, float("-inf"))


def _fa4_reference_setup(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                         window_size_left, window_size_right):  # fmt: skip
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32 and cu_seqlens_q.tolist() == cu_seqlens_k.tolist()
    bounds = cu_seqlens_q.tolist()
    longest = max(np.diff(bounds))
    assert longest <= max_seqlen_q and longest <= max_seqlen_k, (longest, max_seqlen_q, max_seqlen_k)
    groups = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(groups, dim=1) for x in (k, v))
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    left = -1 if window_size_left is None else window_size_left
    right = 0 if causal else (-1 if window_size_right is None else window_size_right)
    return bounds, groups, k, v, scale, left, right


def _reference_fa4_forward(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal=False, softcap=0.0, learnable_sink=None, return_lse=False,
                           window_size_left=None, window_size_right=None, **ignored):  # fmt: skip
    """flash_attn.cute.interface._flash_attn_fwd's semantics on CPU for what packing_fa4 passes: (out, lse, ...)."""
    assert not softcap and learnable_sink is None and return_lse
    bounds, _, k, v, scale, left, right = _fa4_reference_setup(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        window_size_left, window_size_right)  # fmt: skip
    out, lse = torch.zeros_like(q), torch.full((q.shape[1], q.shape[0]), float("-inf"))
    for start, end in zip(bounds[:-1], bounds[1:]):
        scores = _reference_fa4_probabilities(q, k, start, end, scale, left, right)
        lse[:, start:end] = torch.logsumexp(scores, dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[start:end].float()).to(q.dtype)
    return out, lse, None, None, None


def _reference_fa4_backward(q, k, v, out, dout, lse, softmax_scale=None, causal=False, softcap=0.0, *,
                            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic=False,
                            learnable_sink=None, window_size_left=None, window_size_right=None, **ignored):  # fmt: skip
    """_flash_attn_bwd's results on CPU: attention's gradients written out (autograd is off inside a custom op)."""
    assert not softcap and learnable_sink is None
    kv_heads = k.shape[1]
    bounds, groups, k, v, scale, left, right = _fa4_reference_setup(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        window_size_left, window_size_right)  # fmt: skip
    dq, dk, dv = (torch.zeros(x.shape, dtype=torch.float32) for x in (q, k, v))
    for start, end in zip(bounds[:-1], bounds[1:]):
        p = _reference_fa4_probabilities(q, k, start, end, scale, left, right).softmax(-1)  # (h, q, k)
        do, o = dout[start:end].float(), out[start:end].float()
        dv[start:end] = torch.einsum("hqk,qhd->khd", p, do)
        dp = torch.einsum("qhd,khd->hqk", do, v[start:end].float())
        ds = p * (dp - (do * o).sum(-1).transpose(0, 1)[..., None])
        dq[start:end] = torch.einsum("hqk,khd->qhd", ds, k[start:end].float()) * scale
        dk[start:end] = torch.einsum("hqk,qhd->khd", ds, q[start:end].float()) * scale
    dk, dv = (x.view(x.shape[0], kv_heads, groups, -1).sum(2) for x in (dk, dv))
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


def reference_fa4_interface():
    """What ``packing_collators.attention._fa4_ops._interface`` returns on a GPU with FA4, on CPU."""
    return _reference_fa4_forward, _reference_fa4_backward


def loss_and_grads(model, batch):
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def assert_same_loss_and_grads(packed, padded):
    (loss_p, grads_p), (loss_r, grads_r) = packed, padded
    torch.testing.assert_close(loss_p, loss_r, rtol=1e-5, atol=0)
    assert grads_p.keys() == grads_r.keys()
    for name in grads_r:
        torch.testing.assert_close(grads_p[name], grads_r[name], rtol=1e-4, atol=1e-4, msg=name)


def fake_fa4(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
             window_size, learnable_sink, softcap, deterministic):  # fmt: skip
    """flash_attn.cute.flash_attn_varlen_func's semantics for what the backend passes (no sinks/softcap).

    Its input checks as FA4 makes them: one dtype for q, k and v; int32 cu_seqlens; int lengths.
    """
    assert q.ndim == 3 and q.is_contiguous() and isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)
    assert q.dtype == k.dtype == v.dtype, (q.dtype, k.dtype, v.dtype)
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    assert learnable_sink is None and softcap == 0.0 and deterministic is False
    left, right = window_size
    window = (-1 if left is None else left, 0 if causal else (-1 if right is None else right))
    out = reference_varlen_attn(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=softmax_scale,
        window_size=window, enable_gqa=True,
    )  # fmt: skip
    return out, None  # FA4 returns (out, lse)


def half_only(query):
    """The real kernel's dtype rule (bf16/fp16 only) in front of the CPU stand-in."""
    assert query.dtype in (torch.bfloat16, torch.float16), f"FA4 got {query.dtype}"
    return fake_fa4
