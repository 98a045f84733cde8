"""What packing_varlen and packing_fa4 both read from transformers' attention call.

    query (b, heads, s, d)  --autocast_inputs-->  half dtype under autocast
                            --flat-->             (b * s, heads, d): one flat sequence
    cu_seq_lens_q/k, max_length_q/k  --flat_lengths-->  int32 on the query's device, Python ints
    kv_index (optional)              --gather-->        k, v laid out as cu_seq_lens_k says (a shared prompt's
                                                        keys repeat it; causal alignment bottom-right)
    is_causal, sliding_window        --window-->        the kernels' (left, right) window

Cost: views and a dtype cast at most; a tensor ``max_length`` syncs once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..batch import CU_SEQ_LENS_K, CU_SEQ_LENS_Q, KV_INDEX, check_boundary_count, varlen_values

__all__ = ["PackedInputs", "autocast_inputs", "flat", "flat_lengths", "is_causal", "packed_inputs", "window"]


class PackedInputs(NamedTuple):
    """q, k, v (b, heads, s, d) in the kernel's dtype, the packed layout and the mask's shape."""

    query: Any
    key: Any
    value: Any
    cu_q: Any
    cu_k: Any
    max_q: Any
    max_k: Any
    causal: bool
    window: tuple[int, int]

    def flat(self) -> tuple:
        """q, k, v as (b * s, heads, d)."""
        return flat(self.query), flat(self.key), flat(self.value)


def packed_inputs(module, query, key, value, kwargs: dict, *, name: str) -> PackedInputs:
    """From an attention function's ``kwargs``: the checked packed layout (``cu_seq_lens_q/k``,
    ``max_length_q/k``), q/k/v in autocast's dtype, causality and the ``sliding_window``'s window."""
    cu_q, cu_k, max_q, max_k = flat_lengths(query, key, *varlen_values(kwargs), name=name)
    kv_index = kwargs.get(KV_INDEX)
    if kv_index is not None:  # keys laid out apart from the queries (a shared prompt): gathered from the row
        kv_index = kv_index.to(key.device)
        key, value = key.index_select(2, kv_index), value.index_select(2, kv_index)
    query, key, value = autocast_inputs(query, key, value)
    causal = is_causal(module, kwargs)
    window_ = window(causal, kwargs.get("sliding_window"), max_k)
    return PackedInputs(query, key, value, cu_q, cu_k, max_q, max_k, causal, window_)


def flat_lengths(query, key, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, *, name: str):
    """Check the packed-layout kwargs (shapes only: no device sync) and return them for ``name``'s kernel."""
    import torch

    if cu_seq_lens_q is None or max_length_q is None:
        raise ValueError(
            f"attn_implementation={name!r} needs cu_seq_lens_q/k and max_length_q/k in the batch "
            "(model(**batch) passes them to every attention layer); this batch has none. Collate with "
            "FlatteningCollator(), or use attn_implementation='sdpa' for padded batches."
        )
    if query.shape[2] != key.shape[2]:
        raise ValueError(
            f"attn_implementation={name!r} is for training on packed batches: queries "
            f"({query.shape[2]}) and keys ({key.shape[2]}) differ in length, as when decoding with a cache. "
            "Generate with attn_implementation='sdpa' (model.set_attn_implementation('sdpa'))."
        )
    cu_seq_lens_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    max_length_k = max_length_q if max_length_k is None else max_length_k
    if cu_seq_lens_q.ndim != 1 or cu_seq_lens_k.ndim != 1:
        raise ValueError(
            f"cu_seq_lens_q/k must be 1-D (num_seqs + 1,), got shapes {tuple(cu_seq_lens_q.shape)} and "
            f"{tuple(cu_seq_lens_k.shape)}; a DataLoader batch_size above 1 around a collator that already "
            "returns one flat row stacks them. Let the collator see the whole minibatch."
        )
    check_boundary_count(cu_seq_lens_q, CU_SEQ_LENS_Q)
    check_boundary_count(cu_seq_lens_k, CU_SEQ_LENS_K)
    lengths = []
    for value in (max_length_q, max_length_k):
        if isinstance(value, torch.Tensor):
            value = int(value.item())  # a tensor syncs once
        elif not isinstance(value, torch.SymInt):  # a symbolic int stays one: int() would specialise the graph
            value = int(value)
        lengths.append(value)
    cu_q = cu_seq_lens_q.to(device=query.device, dtype=torch.int32)
    cu_k = cu_seq_lens_k.to(device=query.device, dtype=torch.int32)
    return cu_q, cu_k, lengths[0], lengths[1]


def is_causal(module, kwargs: dict) -> bool:
    """The layer's ``is_causal`` kwarg, else its module's (a decoder's self-attention: True)."""
    requested = kwargs.get("is_causal")
    return getattr(module, "is_causal", True) if requested is None else requested


def flat(x):
    """(b, heads, s, d) -> (b * s, heads, d), the kernels' varlen layout: a view when b == 1.

    >>> import torch
    >>> flat(torch.zeros(1, 4, 10, 8)).shape
    torch.Size([10, 4, 8])
    """
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])


def autocast_inputs(query, key, value):
    """q, k, v in autocast's half dtype when autocast is on (Trainer ``bf16=True`` on float32 weights).

    Under autocast the rotary embedding leaves q and k in float32 (the float32 cos/sin of
    float32 hidden states) while v comes out of its projection in bf16; the kernel takes
    half precision only, so cast them as transformers' flash-attention path does.

    >>> import torch
    >>> q = torch.zeros(1, 1, 2, 4)
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     [x.dtype for x in autocast_inputs(q, q, q.bfloat16())]
    [torch.bfloat16, torch.bfloat16, torch.bfloat16]
    >>> [x.dtype for x in autocast_inputs(q, q, q)]  # no autocast: unchanged (the loader refuses float32)
    [torch.float32, torch.float32, torch.float32]
    """
    import torch

    device_type = query.device.type
    if not torch.is_autocast_enabled(device_type):
        return query, key, value
    target = torch.get_autocast_dtype(device_type)
    if target not in (torch.float16, torch.bfloat16):
        return query, key, value
    return tuple(x if x.dtype == target else x.to(target) for x in (query, key, value))


def window(is_causal: bool, sliding_window: int | None, max_length: int) -> tuple[int, int]:
    """The kernel's (left, right) window: (-1, 0) causal, (w - 1, 0) causal sliding, (-1, -1) full.

    >>> window(True, None, 100), window(True, 16, 100), window(True, 4096, 100), window(False, None, 100)
    ((-1, 0), (15, 0), (-1, 0), (-1, -1))
    """
    if sliding_window is not None and max_length > sliding_window:
        left = int(sliding_window) - 1
        return (left, 0) if is_causal else (left, left)
    return (-1, 0) if is_causal else (-1, -1)
