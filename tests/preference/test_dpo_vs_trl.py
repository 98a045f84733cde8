"""PackingDPOTrainer against TRL's DPOTrainer on the same pairs: the same losses and metrics, packed rows.

Both train the same tiny model (float32, CPU) for two steps from the same weights on the same
batches (the stock sampler, one seed); every metric TRL logs must agree within 1e-4 relative, and
the policy must only ever see one packed row (1, T) per micro-batch.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _pairs import text_pairs, word_tokenizer

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
if not hasattr(trl, "DPOConfig") or tuple(int(x) for x in trl.__version__.split(".")[:2]) < (1, 16):
    pytest.skip("PackingDPOTrainer builds on TRL >= 1.16's DPOTrainer", allow_module_level=True)

METRICS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected", "logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy")  # fmt: skip


WINDOWED = {"gemma2": ("Gemma2ForCausalLM", "eager"), "mistral": ("MistralForCausalLM", "sdpa")}
# Qwen2 with use_sliding_window: its code slides only the layers max_window_layers makes sliding (none by default)
QWEN2_WINDOWS = {"qwen2_window_on_no_layer": {}, "qwen2_window_on_layer_1": {"max_window_layers": 1}}


def _model(kind: str):
    from _tiny_models import tiny_model

    if kind == "llama":
        return tiny_model("llama", vocab_size=64, initializer_range=0.05)
    if kind in QWEN2_WINDOWS:  # tied, use_cache on, as its checkpoints; a window shorter than most sequences here
        return tiny_model("qwen2", vocab_size=64, initializer_range=0.05, use_cache=True, tie_word_embeddings=True,
                          use_sliding_window=True, sliding_window=4, **QWEN2_WINDOWS[kind])  # fmt: skip
    if kind == "minimax":  # lightning attention and a model-wide sliding window on its softmax layers, MoE
        from _hybrids import tiny_hybrid

        return tiny_hybrid("minimax").train()
    if kind in WINDOWED:  # the sweep's tiny configs: sliding_window=4, shorter than most sequences here
        from _hybrids import sweep

        class_name, attention = WINDOWED[kind]
        model = sweep.build_tiny(kind, class_name, seed=0)
        model.set_attn_implementation(attention)
        return model.train()
    from _hybrids import tiny_hybrid

    return tiny_hybrid("qwen3_5_text").train()


def _config(tmp_path, **options):
    from trl import DPOConfig

    base = dict(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-3,
                logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                dataloader_pin_memory=False, max_length=64, bf16=False, lr_scheduler_type="constant")  # fmt: skip
    return DPOConfig(**{**base, **options})


def _logs(trainer) -> list[dict]:
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry and "train_runtime" not in entry]


_TRLS_RUNS: dict = {}


def _run(tmp_path, kind, packed: bool, share_prompt: bool = False, **options):
    """(the logged steps, the shapes the policy saw); TRL's run of a set-up once for every test that compares
    against it (with and without share_prompt)."""
    if packed:
        return _train(tmp_path, kind, True, share_prompt, **options)
    key = (kind, repr(sorted(options.items())))
    if key not in _TRLS_RUNS:
        _TRLS_RUNS[key] = _train(tmp_path, kind, False, False, **options)
    return _TRLS_RUNS[key]


def _train(tmp_path, kind, packed: bool, share_prompt: bool, **options):
    from trl import DPOTrainer

    from packing_collators import PackingDPOTrainer

    model = _model(kind)
    reference = copy.deepcopy(model).eval()
    pairs = datasets.Dataset.from_list(text_pairs(12, seed=1))
    shapes = []
    model.register_forward_pre_hook(lambda m, a, k: shapes.append(tuple(k["input_ids"].shape)), with_kwargs=True)
    common = dict(model=model, ref_model=reference, args=_config(tmp_path / f"{packed}{share_prompt}", **options),
                  train_dataset=pairs, processing_class=word_tokenizer())  # fmt: skip
    trainer = PackingDPOTrainer(**common, share_prompt=share_prompt) if packed else DPOTrainer(**common)
    return _logs(trainer), shapes


@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_two_steps_log_what_trl_logs(tmp_path, kind, share_prompt):
    theirs, _ = _run(tmp_path, kind, packed=False)
    ours, shapes = _run(tmp_path, kind, packed=True, share_prompt=share_prompt)
    assert len(ours) == len(theirs) == 2
    for mine, reference in zip(ours, theirs):
        for name in METRICS:
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-5), name
    training = [s for s in shapes if s[1] > 40]  # the probe's short rows aside (a shared row holds each prompt once)
    assert training and all(rows == 1 for rows, _ in training)  # one packed row per micro-batch


@pytest.mark.parametrize("loss_type", ["hinge", "ipo", "robust", "sigmoid_norm", "apo_zero", "sft"])
def test_other_loss_types_match(tmp_path, loss_type):
    options = {"loss_type": [loss_type], "label_smoothing": 0.1 if loss_type == "robust" else 0.0}
    theirs, _ = _run(tmp_path, "llama", packed=False, **options)
    ours, _ = _run(tmp_path, "llama", packed=True, **options)
    # as test_two_steps_log_what_trl_logs: the second step's margins (~0.01) are a difference of rewards that
    # beta x (log-probability sums of ~-20) make, after an AdamW step that scales rounding-sized gradients up to
    # lr: its float32 rounding, which differs between CPU kernels, reaches a few 1e-6 (3e-6 on an AVX-512 machine)
    for mine, reference in zip(ours, theirs):
        assert mine["loss"] == pytest.approx(reference["loss"], rel=1e-4, abs=1e-5)
        assert mine["rewards/margins"] == pytest.approx(reference["rewards/margins"], rel=1e-4, abs=1e-5)


def test_float32_weights_under_trls_default_bf16_train_as_trl(tmp_path):
    # DPOConfig trains in bf16 by default: float32 weights under autocast. The head check once compared outside the
    # autocast and refused every such model; both sides now run the same bf16 autocast, packed and padded
    theirs, _ = _run(tmp_path, "llama", packed=False, bf16=True)
    ours, _ = _run(tmp_path, "llama", packed=True, bf16=True)
    assert len(ours) == len(theirs) == 2
    for mine, reference in zip(ours, theirs):  # bf16 logits: packed and padded rows round apart at 2^-8
        for name in ("loss", "logps/chosen", "logps/rejected", "rewards/margins"):
            assert mine[name] == pytest.approx(reference[name], rel=2e-2, abs=2e-3), name


@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("loss_type", ["ipo", "sigmoid_norm"])
def test_length_normalized_losses_count_completion_tokens_as_trl(tmp_path, loss_type, share_prompt):
    # keep_end at max_length=6 cuts most prompts away, so many sequences start with a completion token: TRL divides
    # by completion_mask.sum(), which counts that token though it is never a target (it was 35.6 vs 29.7 grad_norm)
    options = {"loss_type": [loss_type], "truncation_mode": "keep_end", "max_length": 6}
    theirs, _ = _run(tmp_path, "llama", packed=False, **options)
    ours, _ = _run(tmp_path, "llama", packed=True, share_prompt=share_prompt, **options)
    assert len(ours) == len(theirs) == 2
    for mine, reference in zip(ours, theirs):
        for name in ("loss", "grad_norm", "rewards/margins"):
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-5), name


@pytest.mark.parametrize("kind", list(WINDOWED) + list(QWEN2_WINDOWS))
def test_a_shared_prompt_under_a_sliding_window_trains_as_trl(tmp_path, kind):
    # the dense shared-prompt mask once carried no window and replaced the model's sliding one (Gemma2 eager,
    # window 8: grad_norm 1.49 vs TRL's 1.16): it slides the window now, per layer type where the model has several,
    # and not on a Qwen2 whose window slides no layer (refused before: shared vs unshared 13.2)
    theirs, _ = _run(tmp_path, kind, packed=False)
    ours, _ = _run(tmp_path, kind, packed=True, share_prompt=True)
    assert len(ours) == len(theirs) == 2
    for mine, reference in zip(ours, theirs):
        for name in ("loss", "grad_norm", "rewards/margins", "logps/chosen", "logps/rejected"):
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-5), name


def test_a_shared_prompt_on_lightning_attention_trains_as_trl(tmp_path):
    # MiniMax with share_prompt once failed in its layers (rotary (cos, sin) not laid out as the keys); without the
    # router's aux loss (refused with share_prompt, below) it trains as TRL does
    theirs, _ = _run(tmp_path, "minimax", packed=False, router_aux_loss_coef=0.0)
    ours, _ = _run(tmp_path, "minimax", packed=True, share_prompt=True, router_aux_loss_coef=0.0)
    assert len(ours) == len(theirs) == 2
    for mine, reference in zip(ours, theirs):
        for name in ("loss", "grad_norm", "rewards/margins"):
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-5), name


def test_a_shared_prompt_with_the_routers_aux_loss_is_refused_before_training(tmp_path):
    # the shared row routes a prompt's tokens once where TRL's batch routes them twice: the aux loss would differ
    # (Mixtral, coefficient 0.5: aux 2.09680 vs 2.09905), and under sdpa/eager transformers' loss crashed on the mask
    with pytest.raises(ValueError, match=r"share_prompt=True with the router's auxiliary loss .*router_aux_loss_coef=0.0"):
        _run(tmp_path, "minimax", packed=True, share_prompt=True)
    ours, _ = _run(tmp_path, "minimax", packed=True)  # unshared, the aux loss is TRL's
    theirs, _ = _run(tmp_path, "minimax", packed=False)
    assert ours[0]["aux_loss"] == pytest.approx(theirs[0]["aux_loss"], rel=1e-4)


@pytest.mark.parametrize("share_prompt", [False, True])
def test_the_triton_rows_log_what_trl_logs(tmp_path, monkeypatch, share_prompt):
    # the chunked head's pass as a GPU runs it (the Triton kernel, by Triton's interpreter here): log-probabilities,
    # entropy, mean logit and top-1 accuracy from its one read, the gradient from its second
    pytest.importorskip("triton")  # scripts/install.sh adds it (Linux x86-64); in the oldest venv where CUDA torch brought it
    import packing_collators.loss._chunked as chunked
    from packing_collators.loss import _triton_rows

    calls = []
    monkeypatch.setattr(chunked, "_compiled", lambda compiled, *where: calls.append(compiled) or (
        _triton_rows.chunk if compiled else None))  # fmt: skip
    theirs, _ = _run(tmp_path, "llama", packed=False)
    ours, _ = _run(tmp_path, "llama", packed=True, share_prompt=share_prompt)
    assert calls and all(calls)  # every chunk of ours on the kernel
    for mine, reference in zip(ours, theirs):
        for name in METRICS:
            assert mine[name] == pytest.approx(reference[name], rel=1e-4, abs=1e-5), name
