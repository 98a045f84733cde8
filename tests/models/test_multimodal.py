"""Vision-language models packed: FlatteningCollator + enable_packing give every example its logits alone.

Every VLM type of the list that this transformers has (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, Qwen3.5
with images), tiny and float32: images of three sizes in two examples with a text-only example
between them; the bad inputs the collator and the model refuse, by example.
"""

from __future__ import annotations

import pytest
import torch
from _vlms import alone_logits, available, image_example, mixed_examples, tiny_vlm

from packing_collators import FlatteningCollator, enable_packing
from packing_collators.collate._media import COUNT_KEYS
from packing_collators.models import packing_layers
from packing_collators.models._multimodal import COUNTS

VLMS = available()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1.0))


def _packed(examples: list[dict]) -> dict:
    batch = FlatteningCollator()(examples)
    batch.pop("labels")
    return batch


def test_the_collator_concatenates_images_in_example_order():
    config = tiny_vlm(VLMS[0]).config
    examples = mixed_examples(config)
    batch = FlatteningCollator()(examples)
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 6], [1, 4, 2]]
    assert torch.equal(batch["pixel_values"], torch.cat([examples[0]["pixel_values"], examples[2]["pixel_values"]]))
    assert batch["mm_token_type_ids"].shape == batch["input_ids"].shape
    assert int(batch["mm_token_type_ids"].sum()) == (16 + 12 + 8) // 4
    assert batch["images_per_example"].tolist() == [1, 0, 2]  # what enable_packing checks each example against
    assert COUNT_KEYS == COUNTS  # the collator writes the counts under the names the model's pre-hook takes


@pytest.mark.parametrize("model_type", VLMS)
def test_packed_logits_equal_each_example_alone(model_type):
    model = tiny_vlm(model_type)
    examples = mixed_examples(model.config)
    with torch.no_grad():
        alone = alone_logits(model, examples)
        try:
            naive = model(**_packed(examples)).logits[0]
            assert _relative(naive, alone) > 1e-3  # without enable_packing the row is wrong
        except ValueError as error:  # or refused by transformers (Qwen3.5's Gated DeltaNet without fla)
            assert "packed" in str(error)
        enable_packing(model)
        packed = model(**_packed(examples)).logits[0]
    assert _relative(packed, alone) < 1e-5
    assert "get_rope_index per example" in packing_layers(model).summary()


@pytest.mark.parametrize("model_type", VLMS)
def test_a_batch_of_one_example_with_an_image_gets_its_own_positions(model_type):
    """The sampler gives an example that fills the budget a micro-batch of its own: the collator's
    position_ids (0..T-1, no packing to undo) must not stand in for the image's 3-D positions."""
    model = enable_packing(tiny_vlm(model_type))
    example = image_example(model.config, 7, [(1, 4, 4), (1, 2, 6)], seed=5)
    with torch.no_grad():
        alone = alone_logits(model, [example])
        one = model(**_packed([example])).logits[0]
    assert _relative(one, alone) < 1e-5


def test_several_packed_rows_with_images_are_refused():
    """Rows of a (B > 1, T) batch cannot be given their images' positions: refused, not numbered as text."""
    model = enable_packing(tiny_vlm(VLMS[0]))
    batch = _packed(mixed_examples(model.config))
    batch = {
        k: (torch.cat([v, v]) if k in ("input_ids", "position_ids", "mm_token_type_ids") else v)
        for k, v in batch.items()
    }
    batch = {k: v for k, v in batch.items() if not k.startswith(("cu_seq_lens", "max_length"))}
    batch["pixel_values"] = torch.cat([batch["pixel_values"]] * 2)
    batch["image_grid_thw"] = torch.cat([batch["image_grid_thw"]] * 2)
    with pytest.raises(ValueError, match="one row"), torch.no_grad():
        model(**batch)


@pytest.mark.parametrize("attn", ["eager"])
def test_eager_attention_too(attn):
    model = enable_packing(tiny_vlm("qwen2_5_vl" if "qwen2_5_vl" in VLMS else VLMS[0], attn=attn))
    examples = mixed_examples(model.config)
    with torch.no_grad():
        assert _relative(model(**_packed(examples)).logits[0], alone_logits(model, examples)) < 1e-5


def test_placeholders_that_do_not_match_the_grid_are_refused_by_example():
    model = enable_packing(tiny_vlm(VLMS[0]))
    examples = mixed_examples(model.config)
    examples[2]["image_grid_thw"] = torch.tensor([[1, 2, 6], [1, 4, 4]])  # 4 placeholders more than the tokens
    examples[2]["pixel_values"] = torch.randn(12 + 16, examples[2]["pixel_values"].shape[1])
    with pytest.raises(ValueError, match=r"Example 2 has 5 image placeholder tokens, but its images' grids .* need 7"):
        model(**_packed(examples))


def test_each_example_is_checked_against_its_own_images_so_two_errors_cannot_cancel():
    model = enable_packing(tiny_vlm(VLMS[0]))
    a = image_example(model.config, 6, [(1, 4, 4)], seed=1)  # 4 placeholders, and (below) no image
    b = image_example(model.config, 5, [(1, 2, 6)], seed=2)  # 3 placeholders, and (below) a's image as well
    moved = image_example(model.config, 5, [(1, 4, 4), (1, 2, 6)], seed=3)
    b["pixel_values"], b["image_grid_thw"] = moved["pixel_values"], moved["image_grid_thw"]
    del a["pixel_values"], a["image_grid_thw"]
    batch = _packed([a, b])
    assert batch["images_per_example"].tolist() == [0, 2]
    refused = r"Example 0 has 4 image placeholder tokens, but its images' grids \(no image_grid_thw row\) need 0"
    with pytest.raises(ValueError, match=refused):
        model(**batch)
    # counted over the row (a collator that does not count per example), a's 4 placeholders take b's first image
    # and b's 3 its second: both errors pass
    with torch.no_grad():
        model(**{k: v for k, v in batch.items() if k != "images_per_example"})


def test_pixels_without_a_grid_and_a_grid_without_pixels_are_refused_by_the_collator():
    config = tiny_vlm(VLMS[0]).config
    examples = mixed_examples(config)
    grid = examples[0].pop("image_grid_thw")
    with pytest.raises(ValueError, match=r"Example 0 has pixel_values but no image_grid_thw"):
        FlatteningCollator()(examples)
    examples[0]["image_grid_thw"] = grid
    del examples[2]["pixel_values"]
    with pytest.raises(ValueError, match=r"Example 2 has image_grid_thw but no pixel_values"):
        FlatteningCollator()(examples)


@pytest.mark.parametrize("model_type", VLMS)
@pytest.mark.parametrize("kinds", [True, False])
def test_placeholders_in_a_batch_without_images_are_text_as_the_model_reads_them(model_type, kinds):
    """A policy can sample its image placeholder (an RL completion; TRL passes no mm_token_type_ids): with no image in
    the batch the model reads it as text, alone as packed; this refused it, mid-run, before."""
    model = tiny_vlm(model_type)
    examples = [image_example(model.config, 6, [(1, 2, 2)], seed=1), image_example(model.config, 4, [], seed=2)]
    for key in ("pixel_values", "image_grid_thw") + (() if kinds else ("mm_token_type_ids",)):
        examples[0].pop(key)
    if not kinds:
        examples[1].pop("mm_token_type_ids")
    with torch.no_grad():
        alone = alone_logits(model, examples)
        packed = enable_packing(model)(**_packed(examples)).logits[0]
    assert _relative(packed, alone) < 1e-5


def test_offline_packing_refuses_images_and_points_to_the_online_path():
    datasets = pytest.importorskip("datasets")
    from packing_collators import PrePackedCollator, pack_dataset

    config = tiny_vlm(VLMS[0]).config
    rows = [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in e.items()} for e in mixed_examples(config)]
    with pytest.raises(ValueError, match=r"image or video columns .*Pack a vision-language dataset online"):
        pack_dataset(datasets.Dataset.from_list(rows), max_length=64)
    row = {
        "input_ids": rows[0]["input_ids"],
        "seq_lengths": [len(rows[0]["input_ids"])],
        **{k: rows[0][k] for k in ("pixel_values", "image_grid_thw")},
    }
    with pytest.raises(ValueError, match=r"Row 0 has 'pixel_values': pre-packed rows hold text only"):
        PrePackedCollator()([row])


def test_llava_style_per_image_tensors_are_refused_by_name():
    examples = [{"input_ids": [1, 2, 3], "pixel_values": torch.zeros(3, 8, 8), "image_grid_thw": [[1, 2, 2]]}]
    with pytest.raises(ValueError, match=r"Example 0: pixel_values has shape \(3, 8, 8\).*LLaVA-style"):
        FlatteningCollator()(examples)


def test_the_probe_carries_an_image_and_catches_positions_numbered_over_the_row():
    """The live probe's last example holds an image: without per-example positions its logits move."""
    from packing_collators.checks import probe_packing
    from packing_collators.models._multimodal import MultimodalPositions

    model = enable_packing(tiny_vlm(VLMS[0]))
    model.config.use_cache = False
    assert probe_packing(model).passed
    for module in model.modules():  # take the per-example positions away again
        for key, hook in list(module._forward_pre_hooks.items()):
            if isinstance(hook, MultimodalPositions):
                del module._forward_pre_hooks[key]
    report = probe_packing(model)
    assert not report.passed and report.max_difference > report.tolerance


def test_a_call_with_a_cache_is_left_to_the_model():
    """generate() passes a cache: the model numbers (and remembers) its own positions; the prepared model
    must give what the unprepared one gives, even with the plain position_ids a collator would add."""
    from transformers import DynamicCache

    model = tiny_vlm(VLMS[0])
    example = image_example(model.config, 7, [(1, 4, 4)], seed=6)
    batch = _packed([example])
    batch = {k: v for k, v in batch.items() if not k.startswith(("cu_seq_lens", "max_length"))}
    batch["use_cache"] = True
    with torch.no_grad():
        before = model(**batch, past_key_values=DynamicCache(config=model.config)).logits
        enable_packing(model)
        after = model(**batch, past_key_values=DynamicCache(config=model.config)).logits
    assert torch.equal(after, before)
