"""The varlen paths of Mamba2, short convolutions, KDA and lightning attention compute each layer exactly.

Tiny float32 hybrids on the CPU, their stateful layers on torch reference kernels with fla's signatures
(``_varlen_reference.py``): a packed row's logits and every gradient equal each example run alone
through the layer's own code, with gradient checkpointing too; a kernel that ignores the boundaries
(the conv's, or the scan's) makes the same comparison fail. Sizes that make each mapping matter:
several B/C groups per Mamba2 layer, time-step limits that clamp, random D and dt_bias, Falcon-H1's
multipliers and gated norm both ways.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from _hybrids import HYBRIDS, alone_logits, examples_for, sweep
from _varlen_reference import BLIND_CONV, BLIND_SCAN, REFERENCE, mamba_chunk_scan_combined

from packing_collators import FlatteningCollator, PrePackedCollator, enable_packing
from packing_collators.models import find_stateful_layers, packing_layers
from packing_collators.models._enable import enable_packing_with
from packing_collators.models._kernels import VarlenKernels
from packing_collators.models._ssd import _mamba_chunk_scan

_CLAMP = {"time_step_limit": (0.2, 1.5)}
_FALCON = {"mamba_n_groups": 2, **_CLAMP, "ssm_in_multiplier": 0.7, "ssm_multipliers": [1.3, 0.8, 1.1, 0.9, 1.2]}
# model_type: (overrides, the family its stateful layers take)
FAMILIES = {
    "nemotron_h": ({"n_groups": 2, "time_step_min": 0.2}, "Mamba2"),
    "granitemoehybrid": ({"mamba_n_groups": 2, **_CLAMP}, "Mamba2"),
    "bamba": ({"mamba_n_groups": 2, **_CLAMP}, "Mamba2"),
    "zamba2": ({"mamba_ngroups": 2, "time_step_min": 0.2}, "Mamba2"),
    "falcon_h1": (_FALCON, "Mamba2"),
    "falcon_h1_norm_after_gate": ({**_FALCON, "mamba_rms_norm": True, "mamba_norm_before_gate": False}, "Mamba2"),
    "falcon_h1_norm_before_gate": ({**_FALCON, "mamba_rms_norm": True, "mamba_norm_before_gate": True}, "Mamba2"),
    "lfm2": ({}, "short convolution"),
    "lfm2_moe": ({}, "short convolution"),
    "lfm3": ({}, "short convolution"),
    "kimi_linear": ({}, "KDA"),
    "bailing_hybrid": ({}, "KDA"),
    "minimax": ({}, "lightning attention"),
}
TYPES = [name for name in FAMILIES if name.split("_norm")[0] in HYBRIDS]


def build(name: str, seed: int = 0):
    """A tiny float32 ``name`` in train mode, its recurrences' D and dt_bias drawn at random (not 1)."""
    model_type = name.split("_norm")[0]
    model = sweep.build_tiny(model_type, HYBRIDS[model_type], seed=seed, overrides=FAMILIES[name][0])
    model.set_attn_implementation("sdpa")
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            for parameter in ("D", "dt_bias"):
                if isinstance(getattr(module, parameter, None), torch.nn.Parameter):
                    value = getattr(module, parameter)
                    value.copy_(torch.randn(value.shape, generator=generator) * 1.5)
    return model.train()


def _inputs(examples, collator=None) -> dict:
    batch = (collator or FlatteningCollator())(examples)
    batch.pop("labels", None)
    return batch


def _weighted_sum(logits: torch.Tensor) -> torch.Tensor:
    weights = torch.randn(logits.shape[-2:], generator=torch.Generator().manual_seed(1))
    return (logits.reshape(-1, logits.shape[-1]) * weights).sum()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1.0))


def _on_kernels(name: str, kernels: VarlenKernels, checkpointing: dict | None = None):
    model = enable_packing_with(build(name), lambda: (kernels, ""))
    family = FAMILIES[name][1]
    for _, layer in find_stateful_layers(model):
        assert f"varlen kernels on cpu ({family}," in layer.forward.path, layer.forward.path
    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
    return model


def _assert_gradients_equal(model, reference) -> None:
    checked = 0
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if q.grad is None:
            assert p.grad is None or not p.grad.any(), name
            continue
        assert p.grad is not None, f"{name}: no gradient through the varlen path"
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * float(q.grad.abs().max()) + 1e-7, msg=lambda m: f"{name}: {m}")
        checked += 1
    assert checked > 10


def _assert_packed_equals_alone(name: str, kernels: VarlenKernels) -> None:
    """Logits and every gradient of a packed row on ``kernels`` against each example alone (the layer's own code)."""
    reference = build(name)
    examples = examples_for(reference, (7, 12, 5, 9))
    alone = alone_logits(reference, examples)
    _weighted_sum(alone).backward()
    model = _on_kernels(name, kernels)
    packed = model(**_inputs(examples)).logits[0]
    assert _relative(packed, alone) < 1e-5
    _weighted_sum(packed).backward()
    _assert_gradients_equal(model, reference)


@pytest.mark.parametrize("name", TYPES)
def test_packed_logits_and_gradients_equal_each_example_alone(name):
    _assert_packed_equals_alone(name, REFERENCE)


# The SSD scan as mamba-ssm's kernel is called (boundaries as seq_idx, grouped B and C, D inside), token by token.
MAMBA_SSM = VarlenKernels(
    REFERENCE.conv, REFERENCE.delta_rule, "mamba-ssm signature", "cpu", ssd=_mamba_chunk_scan(mamba_chunk_scan_combined)
)  # fmt: skip


@pytest.mark.parametrize("name", [n for n in TYPES if FAMILIES[n][1] in ("Mamba2", "lightning attention")])
def test_the_ssd_scan_on_mamba_ssms_signature_is_exact(name):
    """Mamba2 and lightning attention through mamba-ssm's ``mamba_chunk_scan_combined`` signature: packed equals
    each example alone, logits and gradients (the seq_idx built from cu_seqlens, the groups, D, a unit step)."""
    _assert_packed_equals_alone(name, MAMBA_SSM)


CHECKPOINTED = [name for name in ("nemotron_h", "falcon_h1_norm_after_gate", "lfm2", "kimi_linear", "minimax")
                if name.split("_norm")[0] in HYBRIDS]  # fmt: skip


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("name", CHECKPOINTED)
def test_gradients_under_gradient_checkpointing(name, reentrant):
    reference = build(name)
    examples = examples_for(reference, (7, 12, 5))
    _weighted_sum(alone_logits(reference, examples)).backward()
    model = _on_kernels(name, REFERENCE, {"use_reentrant": reentrant})
    _weighted_sum(model(**_inputs(examples)).logits).backward()
    _assert_gradients_equal(model, reference)


@pytest.mark.parametrize("name", TYPES)
def test_kernels_that_ignore_the_boundaries_are_caught(name):
    """The control: run the conv, or the recurrence, over the row as one sequence, and packed is not alone."""
    reference = build(name)
    examples = examples_for(reference, (7, 12, 5, 9))
    with torch.no_grad():
        alone = alone_logits(reference, examples)
        family = FAMILIES[name][1]
        only = {"short convolution": [BLIND_CONV], "lightning attention": [BLIND_SCAN]}
        for kernels in only.get(family, [BLIND_CONV, BLIND_SCAN]):
            packed = _on_kernels(name, kernels)(**_inputs(examples)).logits[0]
            assert _relative(packed, alone) > 1e-3, kernels.name


@pytest.mark.skipif("nemotron_h" not in HYBRIDS, reason="this transformers has no Nemotron-H")
def test_padded_prepacked_rows_on_the_varlen_path():
    """Two packed rows padded to one width (a padding mask): the rows run as one flat row of their tokens."""
    reference = build("nemotron_h")
    examples = examples_for(reference, (7, 12, 5, 9, 3))
    rows = [
        {"input_ids": sum((e["input_ids"] for e in group), []), "seq_lengths": [len(e["input_ids"]) for e in group]}
        for group in (examples[:2], examples[2:])
    ]
    with torch.no_grad():
        alone = alone_logits(reference, examples)
        batch = _inputs(rows, PrePackedCollator(mode="pad", max_length=20))
        logits = _on_kernels("nemotron_h", REFERENCE)(**batch).logits
    assert _relative(torch.cat([logits[0, :19], logits[1, :17]]), alone) < 1e-5


@pytest.mark.skipif("nemotron_h" not in HYBRIDS, reason="this transformers has no Nemotron-H")
def test_without_kernels_one_log_line_names_the_extra(caplog):
    model = build("nemotron_h")
    with caplog.at_level(logging.INFO, logger="packing_collators"):
        enable_packing_with(model, lambda: (None, "flash-linear-attention is not importable (ImportError: fla)"))
    lines = [r.getMessage() for r in caplog.records if "run per example" in r.getMessage()]
    assert len(lines) == 1 and 'pip install "packing-collators[hybrid]"' in lines[0], lines
    assert "NemotronHMamba2Mixer x" in lines[0]
    assert packing_layers(model).paths["NemotronHMamba2Mixer"].startswith("per example")
    examples = examples_for(model)
    with torch.no_grad():
        assert _relative(model(**_inputs(examples)).logits[0], alone_logits(model, examples)) < 1e-5


@pytest.mark.skipif("nemotron_h" not in HYBRIDS or "lfm2" not in HYBRIDS, reason="needs Nemotron-H and LFM2")
def test_a_kernel_package_without_a_kernel_sends_only_its_layers_per_example(caplog):
    """No SSD scan (an fla without chunk_simple_gla, no mamba-ssm): Mamba2 runs per example (said once), the short
    conv still on the conv."""
    partial = VarlenKernels(REFERENCE.conv, REFERENCE.delta_rule, "old fla", "cpu", ssd=None, kda=None)
    with caplog.at_level(logging.INFO, logger="packing_collators"):
        mamba = enable_packing_with(build("nemotron_h"), lambda: (partial, ""))
    assert "old fla has no ssd kernel with cu_seqlens" in packing_layers(mamba).paths["NemotronHMamba2Mixer"]
    assert sum("run per example" in r.getMessage() for r in caplog.records) == 1
    conv = enable_packing_with(build("lfm2"), lambda: (partial, ""))
    assert "old fla varlen kernels on cpu (short convolution" in packing_layers(conv).paths["Lfm2ShortConv"]


def test_the_varlen_path_is_not_taken_on_another_device():
    """Kernels for CUDA and hidden states on the CPU: the layer runs per example (the path says so), exact."""
    if "lfm2" not in HYBRIDS:
        pytest.skip("this transformers has no LFM2")
    cuda = VarlenKernels(BLIND_CONV.conv, None, "cuda-only", "cuda")  # would be wrong if it ran
    model = enable_packing_with(build("lfm2").eval(), lambda: (cuda, ""))
    assert "on CUDA" in packing_layers(model).paths["Lfm2ShortConv"]
    examples = examples_for(model)
    with torch.no_grad():
        assert _relative(model(**_inputs(examples)).logits[0], alone_logits(model, examples)) < 1e-5


def test_enable_packing_without_fla_keeps_every_layer_exact():
    """This machine's enable_packing (no fla, or fla without a GPU): every family per example, exact."""
    name = next(iter(TYPES))
    model = enable_packing(build(name).eval())
    examples = examples_for(model)
    with torch.no_grad():
        assert _relative(model(**_inputs(examples)).logits[0], alone_logits(model, examples)) < 1e-5


def _fake_fla(patch, *, hopper_triton_3_6: bool, tilelang: bool) -> None:
    """An installed fla as sys.modules entries: its kernels take cu_seqlens (they are never called here)."""
    import sys
    import types

    def kernel(name):
        def function(q, k, v, g=None, cu_seqlens=None):
            raise AssertionError("not called")

        function.__name__ = name
        return function

    modules = {name: types.ModuleType(name) for name in (
        "fla", "fla.ops", "fla.modules", "fla.utils", "fla.modules.causal_conv1d", "fla.ops.gated_delta_rule",
        "fla.ops.simple_gla", "fla.ops.kda")}  # fmt: skip
    modules["fla.modules.causal_conv1d"].causal_conv1d = kernel("causal_conv1d")
    modules["fla.ops.gated_delta_rule"].chunk_gated_delta_rule = kernel("chunk_gated_delta_rule")
    modules["fla.ops.simple_gla"].chunk_simple_gla = kernel("chunk_simple_gla")
    modules["fla.ops.kda"].chunk_kda = kernel("chunk_kda")
    utils = modules["fla.utils"]
    utils.IS_NVIDIA_HOPPER = utils.TRITON_ABOVE_3_4_0 = hopper_triton_3_6
    utils.TRITON_ABOVE_3_7_1 = False
    for name, module in modules.items():
        patch.setitem(sys.modules, name, module)
    real = importlib.util.find_spec
    patch.setattr("importlib.util.find_spec", lambda name, *a: (object() if tilelang else None) if name == "tilelang"
                  else real(name, *a))  # fmt: skip


def _fake_mamba_ssm(patch, root) -> None:
    """mamba-ssm as built with MAMBA_SKIP_CUDA_BUILD=TRUE: ``import mamba_ssm`` fails on the compiled selective scan,
    its Triton SSD scan module imports (it imports a sibling module of the package too)."""
    package = root / "mamba_ssm"
    (package / "ops" / "triton").mkdir(parents=True)
    (package / "__init__.py").write_text("import selective_scan_cuda  # not built\n")
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "triton" / "__init__.py").write_text("")
    (package / "ops" / "triton" / "ssd_bmm.py").write_text("CHUNKS = 'bmm'\n")
    (package / "ops" / "triton" / "ssd_combined.py").write_text(
        "from mamba_ssm.ops.triton.ssd_bmm import CHUNKS\n\n"
        "def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, seq_idx=None):\n    return CHUNKS\n"
    )
    patch.syspath_prepend(str(root))


@pytest.mark.parametrize("hopper_triton_3_6", [True, False])
def test_the_ssd_scan_comes_from_mamba_ssm_built_without_cuda_and_leaves_no_trace(monkeypatch, tmp_path, hopper_triton_3_6):
    """mamba-ssm installed: the SSD scan is its Triton kernel, on Hopper with Triton 3.6 too, although its package's
    __init__ cannot import; afterwards ``import mamba_ssm`` fails as it did (sys.modules is as it was)."""
    import sys

    from packing_collators.models._kernels import fla_kernels

    with monkeypatch.context() as patch:
        _fake_fla(patch, hopper_triton_3_6=hopper_triton_3_6, tilelang=True)
        _fake_mamba_ssm(patch, tmp_path)
        kernels, why_not = fla_kernels()
        assert not any(name.startswith("mamba_ssm") for name in sys.modules)
        with pytest.raises(ImportError, match="selective_scan_cuda"):
            import mamba_ssm  # noqa: F401
    assert why_not == "" and kernels.ssd.provider == "mamba_chunk_scan_combined" and kernels.why_missing == ""
    assert kernels.name == "flash-linear-attention ? and mamba-ssm ?'s SSD scan"
    with monkeypatch.context() as patch:  # a mamba-ssm whose scan takes no boundaries: not used, and said why
        _fake_fla(patch, hopper_triton_3_6=False, tilelang=True)
        _fake_mamba_ssm(patch, tmp_path / "old")
        combined = tmp_path / "old" / "mamba_ssm" / "ops" / "triton" / "ssd_combined.py"
        combined.write_text(combined.read_text().replace(", seq_idx=None", ""))
        from packing_collators.models._ssd import mamba_ssm_ssd

        assert mamba_ssm_ssd() == (None, "mamba-ssm's mamba_chunk_scan_combined takes no seq_idx "
                                         '(pip install "mamba-ssm>=2.2.4")')  # fmt: skip
        assert fla_kernels()[0].ssd.provider == "chunk_simple_gla"
    cu_seqlens = torch.tensor([0, 3, 5], dtype=torch.int32)
    assert kernels.ssd(torch.zeros(1, 5, 2, 4), None, None, None, None, None, 64, cu_seqlens) == "bmm"


@pytest.mark.parametrize("tilelang", [True, False])
def test_fla_kernels_finds_each_kernel_and_drops_the_gated_ones_fla_would_refuse(monkeypatch, tilelang):
    """On Hopper with Triton 3.4 to 3.7.0, fla's gated chunk backward raises: tilelang stands in for the delta rule's,
    not for simple GLA's (seen on an H100: its backend refuses float32 states and g_gamma), so simple GLA is never
    used there and the delta rule only with tilelang (their layers run per example, and the path says why)."""
    from packing_collators.models._kernels import fla_kernels

    with monkeypatch.context() as patch:
        _fake_fla(patch, hopper_triton_3_6=True, tilelang=tilelang)
        kernels, why_not = fla_kernels()
    assert why_not == "" and kernels.conv is not None and kernels.kda.__name__ == "chunk_kda"
    assert kernels.ssd is None and "simple-GLA backward refuses Hopper" in kernels.why_missing
    assert "needs mamba-ssm there" in kernels.why_missing and "[hybrid,mamba2]" in kernels.why_missing
    if tilelang:
        assert kernels.delta_rule is not None
    else:
        assert kernels.delta_rule is None and "needs tilelang on Hopper with Triton < 3.7.1" in kernels.why_missing


def test_without_mamba_ssm_the_ssd_scan_is_flas_simple_gla_where_its_backward_runs(monkeypatch):
    from packing_collators.models._kernels import fla_kernels

    with monkeypatch.context() as patch:
        _fake_fla(patch, hopper_triton_3_6=False, tilelang=False)
        kernels, _ = fla_kernels()
    assert kernels.ssd.provider == "chunk_simple_gla" and kernels.why_missing == ""


def test_the_install_lines_the_paths_log_name_extras_the_package_defines():
    """The per-example log line and the SSD scan's refusal name ``pip install`` lines: their extras exist, and the
    mamba2 one brings mamba-ssm (built without CUDA: its Triton scan is all the path needs)."""
    import importlib.metadata
    import re

    from packing_collators.models._kernels import HYBRID_EXTRA
    from packing_collators.models._ssd import MAMBA2_EXTRA

    metadata = importlib.metadata.metadata("packing-collators")  # the installed package's (pyproject.toml's) extras
    extras = set(metadata.get_all("Provides-Extra"))
    requires = metadata.get_all("Requires-Dist")
    for line in (HYBRID_EXTRA, MAMBA2_EXTRA):
        named = re.search(r"packing-collators\[([\w,-]+)\]", line).group(1).split(",")
        assert named and set(named) <= extras, (line, sorted(extras))
    assert any(r.startswith("mamba-ssm") and 'extra == "mamba2"' in r for r in requires), requires
    assert any(r.startswith("fla-core") and 'extra == "hybrid"' in r for r in requires), requires
    assert "MAMBA_SKIP_CUDA_BUILD=TRUE" in MAMBA2_EXTRA
