"""The packing_varlen attention backend: registration, argument plumbing, refusals.

The CUDA kernel does not run here; a reference kernel with varlen_attn's signature
(tests/_tiny_models.py) stands in, so what is tested is what reaches the kernel.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
from _tiny_models import random_examples, reference_varlen_attn, tiny_model

from packing_collators import FlatteningCollator, register_varlen_attention, varlen_attention_forward
from packing_collators.attention import _varlen as _attention

REAL_CUDNN_CHECK = _attention._varlen_can_pick_cudnn  # conftest stands it in with "no" for every test


def recording(kernel, calls):
    @functools.wraps(kernel)
    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return kernel(*args, **kwargs)

    return wrapper


@pytest.fixture
def calls(monkeypatch):
    register_varlen_attention()
    seen = []
    monkeypatch.setattr(_attention, "_load_varlen_attn", lambda query: recording(reference_varlen_attn, seen))
    return seen


def test_register_is_idempotent_and_refuses_builtin_names():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    assert register_varlen_attention() == register_varlen_attention() == "packing_varlen"
    assert AttentionInterface._global_mapping["packing_varlen"] is varlen_attention_forward
    assert AttentionMaskInterface._global_mapping["packing_varlen"] is flash_attention_mask
    assert register_varlen_attention("my_varlen") == "my_varlen"
    with pytest.raises(ValueError, match="'sdpa' cannot be used"):
        register_varlen_attention("sdpa")


def test_kernel_gets_collator_lengths_gqa_scale_and_causal_window(calls):
    model = tiny_model("llama", attn="packing_varlen")
    batch = FlatteningCollator()(random_examples([4, 6, 3]))
    model(**batch)
    assert len(calls) == model.config.num_hidden_layers
    (q, k, v, cu_q, cu_k, max_q, max_k), options = calls[0]
    assert q.shape == (13, 4, 8) and k.shape == v.shape == (13, 2, 8)  # k/v not repeated
    assert cu_q.tolist() == cu_k.tolist() == [0, 4, 10, 13] and cu_q.dtype == torch.int32
    assert (max_q, max_k) == (6, 6)
    assert options == {"enable_gqa": True, "scale": 8**-0.5, "window_size": (-1, 0)}


def test_sliding_window_maps_to_left_window(calls):
    model = tiny_model("mistral", attn="packing_varlen", sliding_window=3)
    model(**FlatteningCollator()(random_examples([5, 2])))
    assert calls[0][1]["window_size"] == (2, 0)
    calls.clear()
    model(**FlatteningCollator()(random_examples([3, 2])))  # no example longer than the window
    assert calls[0][1]["window_size"] == (-1, 0)


def _old_kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False):
    """An older varlen_attn signature: no enable_gqa, scale or window_size."""
    return reference_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=is_causal)


def _gqa_inputs_with_kernel(monkeypatch, kernel):
    """q (4 heads), k/v (2 heads) over segments [4, 5], with ``kernel`` standing in; returns the calls too."""
    register_varlen_attention()
    seen = []
    monkeypatch.setattr(_attention, "_load_varlen_attn", lambda query: recording(kernel, seen))
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    return q, k, v, torch.tensor([0, 4, 9], dtype=torch.int32), seen


def test_older_kernel_signature_repeats_kv_and_folds_scale(monkeypatch):
    q, k, v, cu, seen = _gqa_inputs_with_kernel(monkeypatch, _old_kernel)
    out, weights = varlen_attention_forward(
        None, q, k, v, None, scaling=0.5, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5, max_length_k=5
    )
    (_, k_seen, *_), options = seen[0]
    assert k_seen.shape == (9, 4, 8) and options == {"is_causal": True} and weights is None
    want = reference_varlen_attn(
        q[0].transpose(0, 1),
        k[0].transpose(0, 1),
        v[0].transpose(0, 1),
        cu,
        cu,
        5,
        5,
        scale=0.5,
        window_size=(-1, 0),
        enable_gqa=True,
    )
    torch.testing.assert_close(out[0], want)
    with pytest.raises(ValueError, match="has no window_size"):
        varlen_attention_forward(None, q, k, v, None, sliding_window=3, cu_seq_lens_q=cu, max_length_q=5)


def _kernel_2_11(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
):
    """PyTorch 2.11's varlen_attn signature: scale and window_size, no enable_gqa flag."""
    gqa = key.shape[1] != query.shape[1]
    return reference_varlen_attn(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size, enable_gqa=gqa
    )


def test_kernel_without_gqa_flag_gets_kv_heads_unrepeated(monkeypatch):
    q, k, v, cu, seen = _gqa_inputs_with_kernel(monkeypatch, _kernel_2_11)
    out, _ = varlen_attention_forward(None, q, k, v, None, cu_seq_lens_q=cu, max_length_q=5)
    (_, k_seen, v_seen, *_), options = seen[0]
    assert k_seen.shape == v_seen.shape == (9, 2, 8) and options == {"window_size": (-1, 0)}
    want = reference_varlen_attn(
        q[0].transpose(0, 1),
        k[0].transpose(0, 1),
        v[0].transpose(0, 1),
        cu,
        cu,
        5,
        5,
        window_size=(-1, 0),
        enable_gqa=True,
    )
    torch.testing.assert_close(out[0], want)


def test_max_length_as_tensor_and_int64_cu_seq_lens_are_accepted(calls):
    q = k = v = torch.randn(1, 2, 5, 4)
    cu = torch.tensor([0, 2, 5])
    out, _ = varlen_attention_forward(None, q, k, v, None, cu_seq_lens_q=cu, max_length_q=torch.tensor(3))
    (_, _, _, cu_q, cu_k, max_q, max_k), _ = calls[0]
    assert cu_q.dtype == torch.int32 and cu_k.tolist() == [0, 2, 5] and (max_q, max_k) == (3, 3)
    assert out.shape == (1, 5, 2, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attention_mask": torch.ones(1, 5, dtype=torch.bool)}, "got an attention_mask"),
        ({"softcap": 30.0}, "no logit softcapping"),
        ({"s_aux": torch.zeros(2)}, "no attention sinks"),
        ({"dropout": 0.1}, "no attention dropout"),
        ({"cu_seq_lens_q": None}, "needs cu_seq_lens_q/k"),
        ({"cu_seq_lens_q": torch.tensor([[0, 5]], dtype=torch.int32)}, "must be 1-D"),
    ],
)
def test_refusals(kwargs, match, calls):
    q = k = v = torch.randn(1, 2, 5, 4)
    options = {
        "attention_mask": None,
        "cu_seq_lens_q": torch.tensor([0, 5], dtype=torch.int32),
        "max_length_q": 5,
        **kwargs,
    }
    mask = options.pop("attention_mask")
    with pytest.raises(ValueError, match=match):
        varlen_attention_forward(None, q, k, v, mask, **options)
    assert not calls


def test_autocast_on_float32_weights_reaches_the_kernel_in_bf16(calls):
    # Trainer(bf16=True) on a float32 model: rotary leaves q/k in float32, v is bf16.
    model = tiny_model("llama", attn="packing_varlen")
    reference = tiny_model("llama", attn="sdpa")
    batch = FlatteningCollator()(random_examples([6, 3, 5]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
        want = reference(**batch).loss
    (q, k, v, *_), _ = calls[0]
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16
    torch.testing.assert_close(loss, want, rtol=2e-2, atol=2e-2)


def test_decoding_with_a_cache_is_refused(calls):
    q, kv = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 6, 4)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="differ in length, as when decoding"):
        varlen_attention_forward(None, q, kv, kv, None, cu_seq_lens_q=cu, max_length_q=1)


def test_the_real_loader_refuses_cpu_and_fp32():
    with pytest.raises(ValueError, match="needs a CUDA device; the model is on cpu"):
        _attention._load_varlen_attn(torch.zeros(1))
    fake_cuda = type("FakeCuda", (), {"device": torch.device("cuda"), "dtype": torch.float32})()
    with pytest.raises(ValueError, match="needs bf16 or fp16 activations, got torch.float32"):
        _attention._load_varlen_attn(fake_cuda)


def test_kernel_keywords_match_this_torch():
    # Guards the keyword names used above against the installed PyTorch's varlen_attn.
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    params = set(inspect.signature(varlen.varlen_attn).parameters)
    assert {"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k"} <= params
    assert {"scale", "window_size", "enable_gqa"} <= params or "is_causal" in params


@pytest.fixture
def varlen_can_pick_cudnn(monkeypatch):
    """This PyTorch's varlen module as PyTorch 2.14's: one that may route a call to cuDNN's ragged kernel
    (the real check, not the conftest's stand-in that keeps the other tests' windows unbounded)."""
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    monkeypatch.setattr(varlen, "_can_use_cudnn", lambda *args, **kwargs: True, raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(_attention, "_varlen_can_pick_cudnn", REAL_CUDNN_CHECK)
    REAL_CUDNN_CHECK.cache_clear()
    yield
    REAL_CUDNN_CHECK.cache_clear()


def test_the_cudnn_check_is_off_on_rocm_and_where_varlen_has_no_cudnn_route(monkeypatch):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    for name in ("_can_use_cudnn", "_select_backend"):  # as PyTorch 2.10-2.13 have it
        monkeypatch.delattr(varlen, name, raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    REAL_CUDNN_CHECK.cache_clear()
    assert not REAL_CUDNN_CHECK()
    monkeypatch.setattr(varlen, "_can_use_cudnn", lambda *args, **kwargs: True, raising=False)
    monkeypatch.setattr(torch.version, "hip", "6.4")
    REAL_CUDNN_CHECK.cache_clear()
    assert not REAL_CUDNN_CHECK()  # ROCm: never cuDNN, and its builds may ignore windows
    monkeypatch.setattr(torch.version, "hip", None)
    REAL_CUDNN_CHECK.cache_clear()
    assert REAL_CUDNN_CHECK()
    REAL_CUDNN_CHECK.cache_clear()


def test_sliding_window_is_kept_where_cudnn_could_be_picked(varlen_can_pick_cudnn, calls):
    model = tiny_model("mistral", attn="packing_varlen")
    model.config.sliding_window = 4
    model(**FlatteningCollator()(random_examples([4, 6, 3])))
    assert all(options["window_size"] == (3, 0) for _, options in calls)


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_that_can_pick_cudnn_gets_a_bounded_window_and_the_same_outputs(varlen_can_pick_cudnn, causal):
    # PyTorch 2.14 routes window (-1, -1) calls to cuDNN's ragged kernel, in the forward and again in the
    # backward; an unbounded side passed as the longest sequence keeps both on Flash, for the same attention.
    register_varlen_attention()
    seen = []
    kernel = recording(reference_varlen_attn, seen)
    module = type("Layer", (), {"is_causal": causal})()
    batch = FlatteningCollator()(random_examples([4, 6, 3]))
    q, k, v = (torch.randn(1, 2, 13, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    flat = {key: batch[key] for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_attention, "_load_varlen_attn", lambda query: kernel)
        out, _ = varlen_attention_forward(module, q, k, v, None, **flat)
    assert seen[0][1]["window_size"] == ((6, 0) if causal else (6, 6))
    unbounded = (-1, 0) if causal else (-1, -1)
    flat_qkv = [x.transpose(1, 2).reshape(13, 2, 8) for x in (q, k, v)]
    cu = batch["cu_seq_lens_q"].int()
    want = reference_varlen_attn(*flat_qkv, cu, cu, 6, 6, window_size=unbounded)
    torch.testing.assert_close(out.reshape(13, 2, 8), want)
