"""PackingGRPOTrainer (and PackingRLOOTrainer) against TRL's own trainers on the same prompts and seed.

Both load the same tiny checkpoint (float32, CPU, saved once: TRL loads the reference from it when beta > 0),
generate with TRL's own code (the same seed gives the same completions) and train two steps; every metric TRL
logs (loss, grad_norm, rewards, KL, entropy, clip ratios, completion lengths) must agree within 1e-4
relative, and every forward that computes gradients must see one packed row (1, T).
"""

from __future__ import annotations

import pytest
from _grpo import _compare, _run, _trls_logs

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
if tuple(int(x) for x in trl.__version__.split(".")[:2]) < (1, 16):
    pytest.skip("PackingGRPOTrainer builds on TRL >= 1.16's GRPOTrainer", allow_module_level=True)

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny checkpoints on disk, as a user passes a model name: a dense Llama, an MoE (8 experts, 2 per token) and a
    Qwen3.5-like hybrid (Gated DeltaNet and attention layers), their configs' defaults left alone."""
    from _hybrids import tiny_hybrid
    from _moes import tiny_moe
    from _tiny_models import tiny_model

    folder = tmp_path_factory.mktemp("rl_models")
    built = {
        "llama": lambda: tiny_model("llama", vocab_size=64, initializer_range=0.05),
        "qwen3_moe": lambda: tiny_moe("qwen3_moe"),
        "qwen3_5": lambda: tiny_hybrid("qwen3_5_text", defaults=("use_cache",)),
    }
    paths = {}
    for name, build in built.items():
        paths[name] = folder / name
        build().save_pretrained(paths[name])
    return paths


@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_trains_as_trl_on_packed_rows(tmp_path, checkpoints, loss_type, share_prompt):
    options = {"loss_type": loss_type}
    if loss_type == "luspo":  # TRL requires sequence-level importance sampling for it
        options["importance_sampling_level"] = "sequence"
    _compare(tmp_path, checkpoints["llama"], share_prompt, **options)


@pytest.mark.parametrize("options", [
    {"num_iterations": 2, "gradient_accumulation_steps": 2},  # the old policy's log-probabilities, importance ratios
    {"top_entropy_quantile": 0.5},  # the entropy mask
    {"mask_truncated_completions": True},
    {"beta": 0.0},  # no reference
    {"temperature": 0.7},  # log-probabilities of the logits divided by it
])  # fmt: skip
def test_options_that_change_the_log_probabilities_train_as_trl(tmp_path, checkpoints, options):
    _compare(tmp_path, checkpoints["llama"], True, **options)


@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen3_5"])
def test_an_moe_and_a_hybrid_train_as_trl(tmp_path, checkpoints, kind, share_prompt):
    # TRL trains an MoE with its router's aux loss (router_aux_loss_coef 0.001); shared, it is refused (below)
    options = {"router_aux_loss_coef": 0.0} if kind == "qwen3_moe" and share_prompt else {}
    _compare(tmp_path, checkpoints[kind], share_prompt, **options)


def test_a_shared_prompt_with_the_routers_aux_loss_is_refused_and_trains_as_trl_without_it(tmp_path, checkpoints):
    """TRL's padded batch routes each prompt once per completion, a shared row once: the aux loss cannot match."""
    from packing_collators import PackingGRPOTrainer

    with pytest.raises(ValueError, match=r"router's auxiliary loss.*GRPOConfig\(router_aux_loss_coef=0.0\)"):
        _run(tmp_path / "refused", checkpoints["qwen3_moe"], PackingGRPOTrainer, trainer_options={"share_prompt": True})
    _, _, trainer = _run(tmp_path / "unshared", checkpoints["qwen3_moe"], PackingGRPOTrainer)
    assert trainer.aux_loss_enabled  # TRL's default for an MoE; unshared, its aux loss matched TRL's (above)


@pytest.mark.parametrize("share_prompt", [False, True])
def test_rloo_trains_as_trl(tmp_path, checkpoints, share_prompt):
    _compare(tmp_path, checkpoints["llama"], share_prompt, rloo=True)


def test_rloos_sequence_ratio_is_one_as_trls_after_trls_shuffle(tmp_path, checkpoints):
    """RLOO scores the old policy's log-probabilities in generation order and its loss's after TRL's shuffle; its
    ratio is a sum over each sequence, times advantages it does not scale. The same rows make the same packed row in
    both passes, so the ratio is exactly 1, as TRL's: the loss within 1e-6 of TRL's (3e-5 off laid as they came).
    Shared prompts: unshared rows round alike whatever their neighbours on a CPU, so only the shared layout shows it
    here."""
    _compare(tmp_path, checkpoints["llama"], True, rloo=True, loss_abs=1e-6, num_generations=2,
             per_device_train_batch_size=8, max_completion_length=64)  # fmt: skip


def test_a_shared_prompt_computes_each_prompt_once_for_its_group(tmp_path, checkpoints):
    """The same completions, scored unshared and shared: the shared rows hold each group's prompt once."""
    flat, _ = _compare(tmp_path / "flat", checkpoints["llama"], False)
    shared, _ = _compare(tmp_path / "shared", checkpoints["llama"], True)
    assert sum(width for _, width in shared) < sum(width for _, width in flat)


def test_a_prompt_is_computed_once_per_micro_batch_after_trls_shuffle(tmp_path, checkpoints, monkeypatch):
    """TRL shuffles a generation's rows before its loss scores them a micro-batch at a time (steps_per_generation=2:
    four prompts' pairs over two micro-batches), so a prompt's completions arrive apart: each training forward's row
    holds each of its micro-batch's prompts once, and the numbers are TRL's."""
    import torch

    from packing_collators.rl import _logps
    from packing_collators.rl._rows import row_order

    seen, original = [], _logps.PackedLogProbs._get_per_token_logps_and_entropies

    def record(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if torch.is_grad_enabled():
            seen.append((input_ids, attention_mask, logits_to_keep))
        return original(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)

    monkeypatch.setattr(_logps.PackedLogProbs, "_get_per_token_logps_and_entropies", record)
    shapes, _ = _compare(tmp_path, checkpoints["llama"], True, num_generations=2, steps_per_generation=2)
    assert any(row_order(*batch) is not None for batch in seen), "the shuffle left every prompt's rows together"
    expected = []
    for ids, mask, keep in seen:
        real = [ids[i][mask[i].bool()].tolist() for i in range(len(ids))]
        prompts = {tuple(r[: int(mask[i, : ids.shape[1] - keep].sum())]) for i, r in enumerate(real)}
        completions = int(mask[:, -keep:].sum())
        expected.append(sum(len(p) for p in prompts) + completions)
    assert [width for _, width in shapes] == expected


@pytest.mark.parametrize("share_prompt", [False, True])
def test_under_trls_default_bf16_autocast_it_trains_as_trl_to_bf16_rounding(tmp_path, checkpoints, share_prompt):
    """GRPOConfig trains in bf16 by default: float32 weights under autocast. The same completions (rewards equal),
    and the numbers within bf16 rounding of the packed and the padded matmuls (measured: grad_norm 3e-4 to 2e-3
    relative, KL within 1e-5 of TRL's 5e-5 at step 2). With TRL's default gradient checkpointing: the forward runs
    under accelerate's autocast only, as TRL's, and recomputes the same tensors (an autocast of our own around it
    broke the recompute on torch 2.6)."""
    from trl import GRPOTrainer

    from packing_collators import PackingGRPOTrainer

    theirs = _trls_logs(tmp_path / "trl", checkpoints["llama"], GRPOTrainer, bf16=True)
    ours, shapes, _ = _run(tmp_path / "packed", checkpoints["llama"], PackingGRPOTrainer,
                           trainer_options={"share_prompt": share_prompt}, bf16=True)  # fmt: skip
    assert shapes and all(shape[0] == 1 for shape in shapes)
    for a, b in zip(theirs, ours, strict=True):
        assert b["reward"] == a["reward"] and b["completions/mean_length"] == a["completions/mean_length"]
        assert abs(b["kl"] - a["kl"]) <= 2e-5
        # the loss is the policy term plus beta * KL: the policy term within 1e-4, the KL within its own bound (a
        # step whose advantages are all 0 leaves only beta * KL, measured 1e-4 +- 4e-6 on torch 2.6)
        assert abs(b["loss"] - a["loss"]) <= 1e-4 * abs(a["loss"]) + 0.1 * 2e-5
        assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-2)
