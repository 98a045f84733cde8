"""Packed training under torch.compile: the attention custom ops, no graph break, bounded recompiles.

FA4 and PyTorch's Flash varlen kernel run on a GPU only; here FA4's interface is replaced by a
float32 reference (tests/_tiny_models.py) behind the same custom ops, and PyTorch's own varlen
op (``torch_attn::_varlen_attn``) gets CPU kernels built on the same reference. What is tested
is the tracing: custom ops with fake tensors and autograd, ``fullgraph=True`` (no graph break)
on a tiny Llama, losses equal to eager, and how many graphs a run compiles ("aot_eager": the
graphs Dynamo and AOTAutograd build, without Inductor's code generation, seconds on a CPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny_models import fake_fa4, random_examples, reference_fa4_interface, tiny_model

from packing_collators import FlatteningCollator, register_fa4_attention, register_varlen_attention
from packing_collators.attention import _fa4_ops, _varlen
from packing_collators.collate import bucket_length, bucket_padding_fraction, length_buckets
from packing_collators.models import compiled_layer_count
from packing_collators._compat import dynamo_sources_by_pattern
from packing_collators.models._compile_layers import graphs_compiled
from packing_collators.trainer._compile import warm_up_compiled

BACKEND = "aot_eager"


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # fa4_reference: conftest.py


def _reference_window(window_size):
    left, right = window_size or (-1, -1)
    return {"window_size_left": None if left < 0 else left, "window_size_right": None if right < 0 else right}


@pytest.fixture(scope="session")
def _torch_varlen_on_cpu():
    """CPU kernels for PyTorch's own varlen custom ops (forward and backward), from the reference."""
    from torch.nn.attention import varlen  # noqa: F401  (defines the ops)

    forward, backward = reference_fa4_interface()

    @torch.library.register_kernel("torch_attn::_varlen_attn", "cpu")
    def _(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None, window_size=None,
          enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):  # fmt: skip
        out, lse, *_ = forward(query, key, value, cu_seqlens_q=cu_seq_q, cu_seqlens_k=cu_seq_k, max_seqlen_q=max_q,
                               max_seqlen_k=max_k, softmax_scale=scale, causal=is_causal, return_lse=True,
                               **_reference_window(window_size))  # fmt: skip
        return out, lse, torch.zeros(2, dtype=torch.uint64)

    @torch.library.register_kernel("torch_attn::_varlen_attn_backward", "cpu")
    def _(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, rng_state, scale=None,
          window_size=None):  # fmt: skip
        return backward(query, key, value, out, grad_out, lse, scale, is_causal, cu_seqlens_q=cu_seq_q,
                        cu_seqlens_k=cu_seq_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                        **_reference_window(window_size))  # fmt: skip


@pytest.fixture
def varlen_reference(monkeypatch, _torch_varlen_on_cpu):
    """packing_varlen on CPU through PyTorch's real varlen_attn (its custom op with the CPU kernels above)."""
    from torch.nn.attention.varlen import varlen_attn

    register_varlen_attention()
    monkeypatch.setattr(_varlen, "_load_varlen_attn", lambda query: varlen_attn)


def _op_inputs(lengths=(5, 3, 8), heads=4, kv_heads=2, dim=8, dtype=torch.float32):
    total = sum(lengths)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(total, heads, dim, generator=generator, dtype=dtype)
    k, v = (torch.randn(total, kv_heads, dim, generator=generator, dtype=dtype) for _ in range(2))
    cu = torch.tensor(np.r_[0, np.cumsum(lengths)], dtype=torch.int32)
    return q, k, v, cu, max(lengths)


def test_fa4_custom_ops_are_registered_on_registration():
    register_fa4_attention()
    for name in _fa4_ops.ATTENTION_OPS:
        namespace, op = name.split("::")
        assert getattr(getattr(torch.ops, namespace), op).default.name() == name


def test_fa4_ops_pass_opcheck(fa4_reference):
    q, k, v, cu, longest = _op_inputs()
    args = (q, k, v, cu, cu, longest, longest, None, True, -1, -1, 0.0, None, False)
    torch.library.opcheck(torch.ops.packing_collators.fa4_varlen_fwd.default, args)
    for x in (q, k, v):
        x.requires_grad_()
    torch.library.opcheck(torch.ops.packing_collators.fa4_varlen_fwd.default, args)  # autograd registration too


def test_fa4_op_fake_tensors_give_the_kernels_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    register_fa4_attention()
    with FakeTensorMode():
        q, k, v = torch.empty(13, 4, 8, dtype=torch.bfloat16), torch.empty(13, 2, 8), torch.empty(13, 2, 16)
        cu = torch.empty(4, dtype=torch.int32)
        out, lse = torch.ops.packing_collators.fa4_varlen_fwd(
            q, k, v, cu, cu, 6, 6, None, True, -1, -1, 0.0, None, False
        )
        grads = torch.ops.packing_collators.fa4_varlen_bwd(
            out, q, k, v, out, lse, cu, cu, 6, 6, None, True, -1, -1, 0.0, None, False
        )
    assert out.shape == (13, 4, 16) and out.dtype == torch.bfloat16
    assert lse.shape == (4, 13) and lse.dtype == torch.float32  # FA4's varlen lse: (heads, total_q)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (0,)]


def test_fa4_op_matches_the_eager_backend_and_its_gradients(fa4_reference):
    q, k, v, cu, longest = _op_inputs()
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = _fa4_ops.fa4_varlen(*leaves, cu, cu, longest, longest, scale=None, causal=True, window=(-1, -1),
                                    softcap=0.0)  # fmt: skip
    out.square().sum().backward()
    reference = [x.clone().requires_grad_() for x in (q, k, v)]
    expected, _ = fake_fa4(*reference, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
                           softmax_scale=None, causal=True, window_size=(None, None), learnable_sink=None,
                           softcap=0.0, deterministic=False)  # fmt: skip
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)
    for mine, theirs in zip(leaves, reference):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)


def _compiled_loss_and_grads(model, batches, *, fullgraph=True):
    compiled = torch.compile(model, backend=BACKEND, fullgraph=fullgraph)
    losses = []
    for batch in batches:
        loss = compiled(**batch).loss
        loss.backward()
        losses.append(loss.detach())
    return losses, [p.grad.clone() for p in model.parameters()]


def _eager_loss_and_grads(model, batches):
    losses = []
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.detach())
    return losses, [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["packing_fa4", "packing_varlen"])
def test_tiny_llama_compiles_whole_and_matches_eager(attn, request):
    request.getfixturevalue("fa4_reference" if attn == "packing_fa4" else "varlen_reference")
    from torch._dynamo.utils import counters

    collate = FlatteningCollator(pad_to_buckets=[48])
    batches = [collate(random_examples(lengths, seed=i)) for i, lengths in enumerate([[7, 3, 12, 5, 9], [4, 9, 6]])]
    counters.clear()
    compiled = _compiled_loss_and_grads(tiny_model("llama", attn=attn).bfloat16(), batches)  # fullgraph: no break
    assert not counters["graph_break"]  # the compiled run's (the eager one may call compiled helpers of its own)
    eager = _eager_loss_and_grads(tiny_model("llama", attn=attn).bfloat16(), batches)
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0)  # the same ops on the same inputs
    for mine, theirs in zip(compiled[1], eager[1]):  # the reference backward differs from autograd's in rounding
        torch.testing.assert_close(mine.float(), theirs.float(), rtol=0.05, atol=0.05)


@pytest.mark.slow
def test_buckets_bound_the_graphs_and_nothing_recompiles_after_the_warm_up(fa4_reference):
    model = tiny_model("llama", attn="packing_fa4").bfloat16()
    compiled = torch.compile(model, backend=BACKEND, fullgraph=True)
    buckets = (32, 48, 64)
    collate = FlatteningCollator(pad_to_buckets=buckets)
    _, graphs = warm_up_compiled(lambda batch: compiled(**batch).loss.backward(), collate, buckets, vocab=128)
    # n and the max lengths symbolic from the first compile, then the length too at the second bucket
    # (a PyTorch whose dynamic_sources takes no patterns makes the counts symbolic only at the second batch: one more)
    assert graphs == (2 if dynamo_sources_by_pattern() else 3)
    rng = np.random.default_rng(0)
    before, seen = graphs_compiled(), set()
    for i in range(8):  # new numbers of examples, longest examples and buckets
        lengths = rng.integers(1, 20, size=rng.integers(1, 5)).tolist()
        batch = collate(random_examples(lengths, seed=i))
        seen.add(batch["input_ids"].shape[1])
        compiled(**batch).loss.backward()
    assert graphs_compiled() == before and len(seen) >= 2


def test_bucketed_rows_take_a_bounded_set_of_lengths(standard_lengths):
    buckets = length_buckets(16384)
    assert len(buckets) == 4 and buckets[-1] == 16384 and list(buckets) == sorted(buckets)
    collate = FlatteningCollator(pad_to_buckets=buckets, return_tensors="np")
    rng = np.random.default_rng(1)
    lengths = standard_lengths("sft", 4000, seed=2)
    seen, padded, real = set(), 0, 0
    for _ in range(200):
        take = lengths[rng.permutation(len(lengths))[: rng.integers(1, 60)]]
        take = take[np.cumsum(take) <= 16384]
        if not len(take):
            continue
        batch = collate([{"input_ids": np.ones(n, np.int64)} for n in take])
        width = batch["input_ids"].shape[1]
        seen.add(width)
        assert width == bucket_length(int(take.sum()), buckets) and width >= take.sum()
        if take.sum() >= buckets[0]:  # above the smallest bucket a row pads at most 1 - 1/1.25 of its slots
            assert (width - take.sum()) / width <= 0.2 + 64 / width
        padded, real = padded + width, real + int(take.sum())
    assert seen <= set(buckets) and len(seen) <= 4
    assert bucket_padding_fraction([16000, 9000], buckets) == round(1 - 25000 / (16384 + 10496), 4)


def test_bucket_padding_is_a_segment_never_trained():
    examples = random_examples([7, 3, 12], seed=4, completion_only=True)
    plain = FlatteningCollator()(examples)
    bucketed = FlatteningCollator(pad_to_buckets=[16, 32, 64])(examples)
    assert bucketed["input_ids"].shape == (1, 32)
    assert bucketed["labels"][0, 22:].eq(-100).all() and bucketed["input_ids"][0, 22:].eq(0).all()
    assert bucketed["position_ids"][0, 22:].tolist() == list(range(10))  # positions restart: a segment of its own
    assert bucketed["cu_seq_lens_q"].tolist() == [0, 7, 10, 22, 32] and bucketed["max_length_q"] == 12
    model = tiny_model("llama", attn="sdpa")  # packed through position_ids: the padding is an example of its own
    torch.testing.assert_close(model(**bucketed).loss, model(**plain).loss)
    merged = FlatteningCollator(pad_to_multiple_of=8, pad_to_buckets=[16, 32])(examples)  # one padding segment
    assert merged["cu_seq_lens_q"].tolist() == [0, 7, 10, 22, 32]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(pad_to_buckets=[]), "non-empty list of row lengths"),
        (dict(pad_to_buckets=[16, 0]), "0 is not a positive integer row length"),
        (dict(pad_to_buckets="16"), "non-empty list"),
        (dict(pad_to_buckets=[16, 20], pad_to_multiple_of=8), "bucket 20 is not a multiple of pad_to_multiple_of=8"),
    ],
)
def test_bad_buckets_are_refused_at_construction(options, message):
    with pytest.raises(ValueError, match=message):
        FlatteningCollator(**options)


def test_a_batch_longer_than_every_bucket_names_the_fix():
    with pytest.raises(ValueError, match=r"A batch of 22 tokens is longer than the largest bucket \(16\)"):
        FlatteningCollator(pad_to_buckets=[8, 16])(random_examples([7, 3, 12]))
    with pytest.raises(ValueError, match="ratio must be a number > 1"):
        length_buckets(1024, ratio=1)


def _train(tmp_path, *, compiled: bool, monkeypatch=None):
    from _tiny_models import training_args

    from packing_collators import PackingTrainer

    rng = np.random.default_rng(0)
    options = dict(torch_compile=True, torch_compile_backend=BACKEND) if compiled else {}
    trainer = PackingTrainer(
        model=tiny_model("llama", attn="packing_fa4").bfloat16(),
        args=training_args(tmp_path / str(compiled), max_steps=4, gradient_accumulation_steps=1, **options),
        train_dataset=random_examples(rng.integers(3, 30, 48).tolist()),
        max_tokens_per_batch=90,
        attn_implementation=None,
    )
    trainer.train()
    return trainer, [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.slow
def test_trainer_compiles_before_the_first_step_and_trains_as_eager(fa4_reference, tmp_path, monkeypatch):
    from packing_collators.trainer import _check_callback, _compile

    probed, warmed = [], []
    original, warm_up = _check_callback.probe_packing, _compile.warm_up_compiled
    monkeypatch.setattr(
        _check_callback,
        "probe_packing",
        lambda model, *a, **k: probed.append(type(model).__name__) or original(model, *a, **k),
    )
    monkeypatch.setattr(_compile, "warm_up_compiled", lambda *a, **k: warmed.append(warm_up(*a, **k)) or warmed[-1])
    trainer, losses = _train(tmp_path, compiled=True)
    report = trainer.compile_report
    assert report.buckets == (96,)  # the budget, rounded up to a multiple of 8
    # graphs: the warm-up's training graphs (what the docs count per bucket); the probe's forward-only graphs apart
    assert (report.seconds, report.graphs) == warmed[0] and report.graphs >= 1 and report.probe_graphs >= 1
    assert report.recompiles == 0 and report.seconds > 0
    assert f"{report.graphs} training graph(s)" in report.summary()
    assert f"(and {report.probe_graphs} for the live probe)" in report.summary()
    plan = trainer._train_batch_sampler.plan().row_tokens
    assert report.padding_fraction == bucket_padding_fraction(plan, (96,)) > 0
    assert probed == ["LlamaForCausalLM"]  # the model whose layers are compiled in place, as training runs it
    assert compiled_layer_count(trainer.model) == trainer.model.config.num_hidden_layers
    assert trainer._head_loss.heads[id(trainer.model)] is not None  # the chunked loss, not the full logits
    _, eager = _train(tmp_path, compiled=False)
    assert losses[0] == eager[0] and np.allclose(losses, eager, rtol=2e-2)


def test_an_eager_trainer_keeps_its_collator_and_compiles_nothing(tmp_path, fa4_reference):
    from _tiny_models import training_args

    from packing_collators import PackingTrainer

    trainer = PackingTrainer(
        model=tiny_model("llama", attn="packing_fa4").bfloat16(),
        args=training_args(tmp_path, max_steps=1, gradient_accumulation_steps=1),
        train_dataset=random_examples([5, 7, 9, 4] * 4),
        max_tokens_per_batch=32,
        attn_implementation=None,
        packing_probe=False,
    )
    trainer.train()
    assert trainer.compile_report is None
    for batch in trainer.get_train_dataloader():  # no bucket padding (token id 0; the examples' ids are >= 1)
        assert batch["input_ids"].ne(0).all()


@pytest.mark.slow  # seconds; and transformers 5.15 under torch 2.6's Dynamo fails to trace Llama (NameError: torch)
def test_the_check_collates_only_first_examples_that_fit_a_bucket(tmp_path):
    # Before: the check callback collated the first four examples with the bucketed collator and refused the run
    # ("A batch of 180 tokens is longer than the largest bucket (72)"), though every micro-batch fits.
    from _tiny_models import training_args

    from packing_collators import PackingTrainer

    trainer = PackingTrainer(
        model=tiny_model("llama"),
        args=training_args(tmp_path, max_steps=2, gradient_accumulation_steps=1, torch_compile=True,
                           torch_compile_backend="eager"),
        train_dataset=random_examples([45, 45, 45, 45, 10, 20, 30, 12]),
        max_tokens_per_batch=72,
    )  # fmt: skip
    trainer.train()
    assert trainer.compile_report.buckets == (72,)
    assert len([h for h in trainer.state.log_history if "loss" in h]) == 2


def _checkpointing_names() -> list[str]:
    """TrainingArguments' names for activation checkpointing: ``gradient_checkpointing`` (deprecated in 5.25) and,
    from 5.25, ``activation_checkpointing``."""
    from transformers import TrainingArguments

    return ["gradient_checkpointing"] + (["activation_checkpointing"] if hasattr(TrainingArguments, "activation_checkpointing") else [])  # fmt: skip


def _saved_bytes(model, batch) -> int:
    """What one training-mode forward saves for its backward."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t):
        model(**batch)
    return sum(saved)


@pytest.mark.slow
@pytest.mark.parametrize("name", _checkpointing_names())
def test_checkpointing_by_either_name_stays_in_the_compiled_layers(tmp_path, name):
    import warnings

    from _tiny_models import training_args
    from torch._dynamo.utils import counters

    from packing_collators import PackingTrainer

    def train(compiled: bool):
        options = dict(torch_compile=True, torch_compile_backend=BACKEND) if compiled else {}
        args = training_args(tmp_path / str(compiled), max_steps=2, gradient_accumulation_steps=1, **{name: True}, **options)
        trainer = PackingTrainer(model=tiny_model("llama"), args=args, max_tokens_per_batch=90, packing_probe=False,
                                 train_dataset=random_examples(np.random.default_rng(0).integers(3, 30, 24).tolist()))
        trainer.train()
        return trainer, [h["loss"] for h in trainer.state.log_history if "loss" in h]

    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, losses = train(compiled=True)
    ours = [w for w in caught if issubclass(w.category, FutureWarning) and "packing_collators" in w.filename]
    assert not ours, [str(w.message) for w in ours]  # the library itself calls nothing by a deprecated name
    model = trainer.model
    assert compiled_layer_count(model) == 2 and all(layer.gradient_checkpointing for layer in model.model.layers)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(counters["graph_break"])
    _, eager = train(compiled=False)
    assert losses[0] == pytest.approx(eager[0], rel=1e-5) and np.allclose(losses, eager, rtol=1e-4)
    # the checkpoint kept: a layer saves its input, not its activations (tiny model: under 0.65 of what none saves)
    batch = FlatteningCollator()(random_examples([9, 14, 5, 11]))
    model.train()
    checkpointed = _saved_bytes(model, batch)
    for layer in model.model.layers:
        layer.gradient_checkpointing = False
    assert checkpointed < 0.65 * _saved_bytes(model, batch)


@pytest.mark.parametrize("compiled", [True, False])
def test_transformers_flash_attention_4_runs_as_the_one_op_once_the_layers_compile(tmp_path, fa4_reference, compiled):
    # Dynamo traced into transformers' FA4 wrapper (graph breaks at FA4's DLTensorWrapper and lru_cache calls): the
    # compiled layers call the same kernel through packing_fa4's custom op; eager, the model's choice stays
    from _tiny_models import training_args

    from packing_collators import PackingTrainer

    model = tiny_model("llama").bfloat16()
    model.config._attn_implementation = "flash_attention_4"  # as loaded with it (no flash-attn-4 on this CPU)
    options = dict(torch_compile=True, torch_compile_backend=BACKEND) if compiled else {}
    trainer = PackingTrainer(
        model=model,
        args=training_args(tmp_path, max_steps=1, gradient_accumulation_steps=1, **options),
        train_dataset=random_examples([5, 7, 9, 4] * 4),
        max_tokens_per_batch=32,
        attn_implementation=None,
        packing_probe=False,
    )
    assert compiled_layer_count(trainer.model) == (model.config.num_hidden_layers if compiled else 0)
    layers = {layer.self_attn.config._attn_implementation for layer in trainer.model.model.layers}
    assert layers == {"packing_fa4" if compiled else "flash_attention_4"}
