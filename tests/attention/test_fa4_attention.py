"""packing_fa4 on CPU: FA4's kernel replaced by a per-segment sdpa reference of its signature.

What runs here is everything around the kernel: the arguments the backend builds (flat
q/k/v, cu_seqlens, causal, scale, sliding window, softcap, sinks), its refusals, the
packed = padded loss and gradients through real transformers models, and how the
library's checks and attention choice treat it. The kernel itself runs on the GPU
(benchmarks/gpu/exactness.py fa4 --attn packing_fa4).
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import (
    ARCHITECTURES,
    assert_same_loss_and_grads,
    fake_fa4,
    half_only,
    loss_and_grads,
    padded_batch,
    random_examples,
    tiny_model,
)

from packing_collators import FlatteningCollator, check_packing_support, register_fa4_attention
from packing_collators.attention import _choice, _fa4, attention_kind

LENGTHS = [7, 3, 12, 5, 9]


@pytest.fixture
def fa4_on_cpu(monkeypatch):
    register_fa4_attention()
    monkeypatch.setattr(_fa4, "_kernel", lambda query: fake_fa4)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_packed_equals_padded(arch, fa4_on_cpu):
    examples = random_examples(LENGTHS, seed=3, completion_only=True)
    reference = loss_and_grads(tiny_model(arch, attn="sdpa"), padded_batch(examples))
    model = tiny_model(arch, attn="packing_fa4")
    batch = FlatteningCollator()(examples)
    assert check_packing_support(model, batch) == "packing_fa4"
    assert_same_loss_and_grads(loss_and_grads(model, batch), reference)


def test_kernel_arguments(monkeypatch):
    seen = {}

    def record(q, k, v, **kwargs):
        seen.update(kwargs, shapes=(q.shape, k.shape, v.shape), dtypes=(q.dtype, k.dtype, v.dtype))
        return torch.zeros_like(q), None

    monkeypatch.setattr(_fa4, "_kernel", lambda query: record)
    monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC", raising=False)
    module = type("Attn", (), {"is_causal": True})()
    q, k = torch.zeros(1, 4, 10, 8), torch.zeros(1, 2, 10, 8)
    cu = torch.tensor([0, 6, 10], dtype=torch.int64)  # int64 from a custom collator: cast to int32
    forward = _fa4.fa4_attention_forward
    out, weights = forward(
        module, q, k, k, None, scaling=0.5, sliding_window=4, softcap=30.0, s_aux="sinks",
        cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=6, max_length_k=torch.tensor(6),
    )  # fmt: skip
    assert out.shape == (1, 10, 4, 8) and weights is None
    assert seen["shapes"] == ((10, 4, 8), (10, 2, 8), (10, 2, 8))
    assert seen["cu_seqlens_q"].dtype == torch.int32 and seen["cu_seqlens_q"].tolist() == [0, 6, 10]
    assert seen["max_seqlen_q"] == 6 and seen["max_seqlen_k"] == 6 and isinstance(seen["max_seqlen_k"], int)
    assert seen["softmax_scale"] == 0.5 and seen["causal"] is True and seen["deterministic"] is False
    assert seen["window_size"] == (3, 0)  # a token sees itself and w - 1 earlier ones
    assert seen["softcap"] == 30.0 and seen["learnable_sink"] == "sinks"
    # bidirectional layers keep their window on both sides (an encoder-style or bidirectional model)
    forward(module, q, k, k, None, sliding_window=4, cu_seq_lens_q=cu, max_length_q=6, is_causal=False)
    assert seen["causal"] is False and seen["window_size"] == (3, 3) and seen["softcap"] == 0.0
    assert seen["cu_seqlens_k"].tolist() == [0, 6, 10] and seen["max_seqlen_k"] == 6  # k defaults to q
    # no window where it cannot bind (every segment within it), and none without one
    forward(module, q, k, k, None, sliding_window=6, cu_seq_lens_q=cu, max_length_q=6)
    assert seen["window_size"] == (None, None) and seen["causal"] is True
    # Trainer(full_determinism=True) sets FLASH_ATTENTION_DETERMINISTIC; a layer's kwarg wins over it
    monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1")
    forward(module, q, k, k, None, cu_seq_lens_q=cu, max_length_q=6)
    assert seen["deterministic"] is True
    forward(module, q, k, k, None, cu_seq_lens_q=cu, max_length_q=6, deterministic=False)
    assert seen["deterministic"] is False
    # under autocast (bf16=True on float32 weights) q/k/v reach the kernel in one half dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        forward(module, q, k, k.bfloat16(), None, cu_seq_lens_q=cu, max_length_q=6)
    assert seen["dtypes"] == (torch.bfloat16,) * 3


def test_float32_activations_are_refused_before_the_kernel():
    with pytest.raises(ValueError, match="needs bf16 or fp16 activations, got torch.float32"):
        _fa4._kernel(torch.zeros(4, 2, 8))


def test_packed_equals_padded_under_autocast(monkeypatch):
    # float32 weights, Trainer bf16=True: the kernel (half only, like FA4) gets bf16 q/k/v
    register_fa4_attention()
    monkeypatch.setattr(_fa4, "_kernel", half_only)
    examples = random_examples(LENGTHS, seed=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        padded = tiny_model("llama", attn="sdpa")(**padded_batch(examples)).loss
        packed = tiny_model("llama", attn="packing_fa4")(**FlatteningCollator()(examples)).loss
    torch.testing.assert_close(packed, padded, rtol=2e-2, atol=0)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(attention_mask=torch.ones(1, 10)), "got an attention_mask"),
        (dict(dropout=0.1), "no attention dropout"),
        (dict(key=torch.zeros(1, 2, 11, 8)), "differ in length"),
        (dict(cu_seq_lens_q=None), "needs cu_seq_lens_q/k"),
        (dict(cu_seq_lens_q=torch.tensor([[0, 10]], dtype=torch.int32)), "must be 1-D"),
    ],
)
def test_refusals_name_the_alternative(change, message, monkeypatch):
    monkeypatch.setattr(_fa4, "_kernel", lambda query: pytest.fail("the kernel must not run"))
    cu = torch.tensor([0, 10], dtype=torch.int32)
    args = dict(query=torch.zeros(1, 4, 10, 8), key=torch.zeros(1, 2, 10, 8), value=torch.zeros(1, 2, 10, 8))
    args.update(attention_mask=None, cu_seq_lens_q=cu, max_length_q=10)
    args.update(change)
    with pytest.raises(ValueError, match=message) as error:
        _fa4.fa4_attention_forward(None, **args)
    assert "packing_fa4" in str(error.value) or "1-D" in str(error.value)


def test_missing_flash_attn_is_an_import_error_that_says_what_to_install(monkeypatch):
    monkeypatch.setattr(_fa4, "_KERNEL", [])
    monkeypatch.setitem(__import__("sys").modules, "flash_attn.cute", None)
    with pytest.raises(ImportError, match=r"packing-collators\[fa4\]"):
        _fa4._kernel(torch.zeros(4, 2, 8, dtype=torch.bfloat16))


def test_checks_know_it_reads_cu_seq_lens():
    register_fa4_attention()
    assert attention_kind("packing_fa4") == "cu_seq_lens"
    # it has logit softcapping (packing_varlen has not), and no dropout
    softcapped = tiny_model("llama", attn="packing_fa4")
    softcapped.config.attn_logit_softcapping = 50.0
    assert check_packing_support(softcapped, probe=False) == "packing_fa4"
    dropout = tiny_model("llama", attn="packing_fa4", attention_dropout=0.1)
    with pytest.raises(ValueError, match="attention_dropout=0.1, which 'packing_fa4' lacks"):
        check_packing_support(dropout, probe=False)


def test_choice_prefers_it_where_transformers_accepts_fa4(monkeypatch):
    register_fa4_attention()
    monkeypatch.setattr(_choice, "packed_attention_candidates", lambda device: ["packing_fa4", "sdpa"])
    model = tiny_model("llama", attn="eager")
    # on this CPU transformers refuses flash_attention_4, so packing_fa4 is not taken either
    assert _choice.choose_attention(model) == "sdpa"
    accepted = []
    original = type(model).set_attn_implementation

    def accept_fa4(self, name):
        if name == "flash_attention_4":
            accepted.append(name)  # transformers' validation of the install and GPU passed
            return
        original(self, name)

    monkeypatch.setattr(type(model), "set_attn_implementation", accept_fa4)
    model = tiny_model("llama", attn="eager")
    assert _choice.choose_attention(model) == "packing_fa4" and accepted == ["flash_attention_4"]
    assert model.config._attn_implementation == "packing_fa4"


def test_trainer_warm_up_runs_under_the_trainers_autocast(monkeypatch, tmp_path):
    # float32 weights with bf16=True: the warm-up's forwards must autocast as training does (the
    # forward accelerate prepared does), or a half-only kernel (FA4) gets float32 activations and
    # training dies before its first step
    from _tiny_models import training_args

    from packing_collators import PackingTrainer

    from transformers import TrainerCallback

    calls = []  # the longest sequence of each kernel call, through the half-only rule

    def recording(query):
        kernel = half_only(query)  # refuses float32: the warm-up must autocast as training does
        return lambda *args, **kwargs: calls.append(kwargs["max_seqlen_q"]) or kernel(*args, **kwargs)

    class WarmedUp(TrainerCallback):  # added after the trainer's own: runs once the warm-up is done
        def on_train_begin(self, args, state, control, **kwargs):
            self.calls = list(calls)

    register_fa4_attention()
    monkeypatch.setattr(_fa4, "_kernel", recording)
    trainer = PackingTrainer(
        model=tiny_model("llama", attn="packing_fa4"),
        args=training_args(tmp_path, bf16=True, max_steps=1, gradient_accumulation_steps=1),
        train_dataset=random_examples([5, 7, 9, 4] * 4),
        max_tokens_per_batch=32,
        attn_implementation=None,
        packing_probe=False,
    )
    warmed = WarmedUp()
    trainer.add_callback(warmed)
    trainer.train()
    assert trainer.state.global_step == 1 and len(calls) > len(warmed.calls) > 0  # warm-up, then the step
    assert max(warmed.calls) == 9  # compiled up to the longest example a micro-batch holds, before the first step


def test_warm_up_attention_runs_its_forwards_under_the_autocast_it_is_given(monkeypatch):
    # PackingTrainer passes the Trainer's autocast: float32 weights would otherwise give FA4 float32 activations
    from packing_collators import warm_up_attention

    register_fa4_attention()
    monkeypatch.setattr(_fa4, "_kernel", half_only)
    model = tiny_model("llama", attn="packing_fa4")
    with pytest.raises(AssertionError, match="FA4 got torch.float32"):
        warm_up_attention(model, max_length=16, tokens=32)
    assert warm_up_attention(model, max_length=16, tokens=32, autocast=torch.autocast("cpu", dtype=torch.bfloat16)) >= 0
    assert all(p.grad is None for p in model.parameters()) and model.dtype == torch.float32


@pytest.mark.parametrize("name", ["packing_fa4", "packing_varlen"])
def test_asking_for_a_library_backend_by_name_registers_it(name, monkeypatch):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    monkeypatch.delitem(AttentionInterface._global_mapping, name, raising=False)
    monkeypatch.delitem(AttentionMaskInterface._global_mapping, name, raising=False)
    model = tiny_model("llama", attn="sdpa")
    assert _choice.choose_attention(model, name) == name
    assert model.config._attn_implementation == name


def test_a_model_that_does_not_switch_is_not_reported_as_switched(monkeypatch):
    # transformers only warns where a model cannot change its attention: the choice must not
    # claim an implementation the model does not run
    register_fa4_attention()
    model = tiny_model("llama", attn="sdpa")
    monkeypatch.setattr(type(model), "set_attn_implementation", lambda self, name: None)
    with pytest.raises(ValueError, match="did not switch to attn_implementation='packing_varlen'"):
        _choice.choose_attention(model, "packing_varlen")
    monkeypatch.setattr(_choice, "packed_attention_candidates", lambda device: ["packing_varlen"])
    assert _choice.choose_attention(model) == "sdpa" == model.config._attn_implementation


def test_what_a_backend_lacks_follows_the_function_registered_not_the_name(monkeypatch):
    from transformers import AttentionInterface
    from transformers.integrations.flash_attention import flash_attention_forward

    from packing_collators import register_varlen_attention

    monkeypatch.setitem(AttentionInterface._global_mapping, "my_flash", flash_attention_forward)
    register_varlen_attention("my_varlen")
    softcapped = tiny_model("llama", attn="sdpa")
    softcapped.config.attn_logit_softcapping = 50.0
    softcapped.config._attn_implementation = "my_flash"  # FA2/3/4's own function: it has softcapping
    assert check_packing_support(softcapped, probe=False) == "my_flash"
    softcapped.config._attn_implementation = "my_varlen"  # torch's varlen kernel, under another name
    with pytest.raises(ValueError, match="softcapping.*PyTorch's varlen kernel lacks"):
        check_packing_support(softcapped, probe=False)


def test_importing_the_library_keeps_fa4_kernels_on_disk_unless_the_user_chose():
    # FA4 reads the variable when flash_attn.cute is imported: this library, imported first, turns its disk cache on
    import os

    from packing_collators.attention._fa4 import FA4_DISK_CACHE, keep_fa4_kernels_on_disk

    assert os.environ[FA4_DISK_CACHE] in ("0", "1")  # set by the import (or by the user before it)
    assert keep_fa4_kernels_on_disk({FA4_DISK_CACHE: "0"}) == "0" and keep_fa4_kernels_on_disk({}) == "1"
