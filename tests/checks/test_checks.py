"""check_packing_support refuses each configuration that would mix examples or break, and passes good ones."""

from __future__ import annotations

import pytest
import torch
from _tiny_models import padded_batch, random_examples, tiny_model

from packing_collators import FlatteningCollator, check_packing_support, enable_packing, register_varlen_attention
from packing_collators.attention import attention_kind


class _Config:
    """A bare config for stub models."""

    def __init__(self, **attrs):
        self._attn_implementation = "sdpa"
        self.use_cache = False
        self.__dict__.update(attrs)


class _Model(torch.nn.Module):
    def __init__(self, **config):
        super().__init__()
        self.config = _Config(**config)

    def forward(self, input_ids, position_ids=None, labels=None, **kwargs):
        raise NotImplementedError


class _Hybrid(_Model):
    """A stub with a layer that carries state along the sequence (a depthwise short convolution)."""

    def __init__(self, **config):
        super().__init__(**config)
        self.mixer = torch.nn.Module()
        self.mixer.conv1d = torch.nn.Conv1d(8, 8, kernel_size=4, groups=8, padding=3)


class _Multimodal(_Model):
    """A stub whose positions come from image grids (a module with get_rope_index), or not (``rope_index=False``)."""

    def __init__(self, rope_index: bool = True, **config):
        super().__init__(rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24]}, **config)
        self.config.vision_config = _Config()
        self.model = torch.nn.Module()
        self.model.config = self.config
        if rope_index:
            self.model.get_rope_index = lambda *args, **kwargs: None


class _NoPositions(_Model):
    def forward(self, input_ids, labels=None, **kwargs):
        raise NotImplementedError


class _NoKwargs(_Model):
    def forward(self, input_ids, position_ids=None, labels=None):
        raise NotImplementedError


@pytest.fixture(scope="module")
def flat():
    return FlatteningCollator()(random_examples([4, 6, 3]))


def test_a_good_model_and_batch_pass(flat):
    assert check_packing_support(tiny_model("llama"), flat) == "sdpa"
    assert check_packing_support(_Model(), flat, probe=False) == "sdpa"  # a stub: static checks only
    padded = padded_batch(random_examples([4, 6, 3]))
    padded["position_ids"] = (padded["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # pads repeat position 0
    assert check_packing_support(tiny_model("llama"), padded) == "sdpa"  # padded batches are not flattened


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (_NoPositions(), "forward takes no position_ids"),
        (_NoKwargs(), "forward takes no \\*\\*kwargs"),
        (_Model(use_cache=True), "use_cache is True"),
        (_Model(_attn_implementation="my_kernel"), "'my_kernel', which is not known to honour packed boundaries"),
        (_Multimodal(), r"numbers positions from image and video grids .*enable_packing\(model\)"),
        (_Multimodal(rope_index=False), r"multimodal rope \(mrope_section=\[16, 24, 24\]\) but has no get_rope_index"),
        (_Hybrid(), r"carry state along the sequence \(Module x1\).*enable_packing\(model\)"),
    ],
)
def test_model_refusals(model, match):
    with pytest.raises(ValueError, match=match):
        check_packing_support(model)


def test_varlen_kernel_limits_are_refused():
    name = register_varlen_attention()
    with pytest.raises(ValueError, match="softcapping"):
        check_packing_support(_Model(_attn_implementation=name, attn_logit_softcapping=50.0))
    with pytest.raises(ValueError, match="attention_dropout=0.1"):
        check_packing_support(_Model(_attn_implementation=name, attention_dropout=0.1))
    assert check_packing_support(_Model(_attn_implementation=name), probe=False) == name


def test_batch_refusals(flat):
    model = _Model()
    cases = [
        ({"attention_mask": torch.ones_like(flat["input_ids"])}, "also has an attention_mask"),
        ({"position_ids": None}, "has no position_ids"),
        ({"position_ids": torch.arange(13)[None]}, "position_ids do not restart"),
        ({"position_ids": torch.zeros(3, 1, 13, dtype=torch.long)}, "one row, \\(1, T\\)"),
        ({"cu_seq_lens_q": torch.tensor([0, 4, 10], dtype=torch.int32)}, "does not split the 13 tokens"),
        ({"use_cache": True}, "use_cache=True"),
    ]
    for change, match in cases:
        batch = {**flat, **change}
        batch = {k: v for k, v in batch.items() if v is not None}
        with pytest.raises(ValueError, match=match):
            check_packing_support(model, batch)


def test_varlen_needs_cu_seq_lens_in_the_batch(flat):
    model = _Model(_attn_implementation=register_varlen_attention())
    batch = {k: v for k, v in flat.items() if not k.startswith(("cu_seq", "max_length"))}
    with pytest.raises(ValueError, match="needs cu_seq_lens_q/k and max_length_q/k in the batch"):
        check_packing_support(model, batch)
    # flash-attention derives them from position_ids itself
    assert (
        check_packing_support(_Model(_attn_implementation="flash_attention_2"), batch, probe=False)
        == "flash_attention_2"
    )


def test_stateful_layers_need_enable_packing_whatever_the_batch():
    examples = random_examples([4, 6, 3])
    for batch in (FlatteningCollator()(examples), FlatteningCollator(return_seq_idx=True)(examples)):
        with pytest.raises(ValueError, match=r"enable_packing\(model\) before training"):
            check_packing_support(_Hybrid(), batch, probe=False)
    model = _Hybrid()
    enable_packing(model)
    assert check_packing_support(model, FlatteningCollator()(examples), probe=False) == "sdpa"


def test_wrappers_are_unwrapped(flat):
    class Wrapper(torch.nn.Module):  # like DDP: the model is .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    with pytest.raises(ValueError, match="use_cache is True"):
        check_packing_support(Wrapper(_Model(use_cache=True)), {k: v for k, v in flat.items() if k != "use_cache"})
    with pytest.raises(TypeError, match="needs a transformers model"):
        check_packing_support(torch.nn.Linear(2, 2))


def test_attention_kind():
    assert [attention_kind(n) for n in ("flash_attention_3", "eager", "flex_attention", None)] == [
        "cu_seq_lens",
        "position_ids",
        "position_ids",
        "unknown",
    ]
    assert attention_kind(register_varlen_attention()) == "cu_seq_lens"


def test_packed_rows_without_cu_seq_lens_are_refused_under_flash_attention():
    # PrePackedCollator(mode="pad"): several rows, positions restarting, no cu_seq_lens. transformers'
    # flash path treats a batch of more than one row as unpacked (measured on an H200 with
    # flash_attention_4: max logit difference 1.89 against each example alone).
    from packing_collators import PrePackedCollator

    rows = [{"input_ids": [5, 6, 7, 8, 9], "seq_lengths": [3, 2]}, {"input_ids": [3, 4, 5], "seq_lengths": [3]}]
    batch = PrePackedCollator(mode="pad", max_length=6)(rows)
    for name in ("flash_attention_2", "flash_attention_3", "flash_attention_4"):
        with pytest.raises(
            ValueError, match="has 2 rows whose position_ids restart .* PrePackedCollator\\(mode='flatten'\\)"
        ):
            check_packing_support(_Model(_attn_implementation=name), batch, probe=False)
    assert (
        check_packing_support(_Model(), batch, probe=False) == "sdpa"
    )  # sdpa/eager/flex mask each row by position_ids
    flat = PrePackedCollator()(rows)
    assert (
        check_packing_support(_Model(_attn_implementation="flash_attention_2"), flat, probe=False)
        == "flash_attention_2"
    )
