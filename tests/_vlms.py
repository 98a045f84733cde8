"""Tiny vision-language models (Qwen2-VL-style multimodal rope) and processor-style examples with synthetic images.

A model is the sweep's tiny config of its type (``benchmarks/_architectures.py``) with a two-block
vision tower of width 32, patches of 2 and a 2x2 merge, and rotary sections that fit the tiny heads.
An example is what a processor returns for one conversation: ``input_ids`` with ``<start> <image>*n
<end>`` per image (n = t*h*w / 4), ``mm_token_type_ids`` (1 on image tokens), ``pixel_values``
(t*h*w, 3*2*2*2) and ``image_grid_thw``; a text-only example has the first two keys only.
"""

from __future__ import annotations

import torch
from _hybrids import sweep

VLMS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "qwen3_5")
_VISION = dict(depth=2, num_heads=2, hidden_size=32, embed_dim=32, intermediate_size=64, out_hidden_size=32,
               patch_size=2, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[1], window_size=8,
               deepstack_visual_indexes=[0], num_position_embeddings=64)  # fmt: skip


# hybrids whose checkpoints are vision-language models with a composite config (qwen3_5 is in VLMS)
COMPOSITE_HYBRIDS = ("qwen3_5_moe", "qwen4_exp")
# types whose checkpoints' config.json is flat: text keys, "use_cache": true among them, at the top
FLAT_CHECKPOINTS = ("qwen2_vl", "qwen2_5_vl")


def available(types: tuple[str, ...] = VLMS) -> tuple[str, ...]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return tuple(t for t in types if t in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def tiny_vlm(
    model_type: str, *, attn: str = "sdpa", seed: int = 0, defaults: tuple[str, ...] = (), flat: bool = False
):
    """A tiny ``model_type`` in eval mode; ``defaults`` (e.g. ``("use_cache",)``) left as the config class has
    them; ``flat``: its config rebuilt from the flat layout a checkpoint's config.json has (text keys at the top,
    no ``text_config``: Qwen2-VL, Qwen2.5-VL), ``"use_cache": true`` among them."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    config = sweep.tiny_config(model_type, defaults=defaults)
    for name, value in _VISION.items():
        if hasattr(config.vision_config, name):
            setattr(config.vision_config, name, value)
    text = config.text_config
    half = (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads) // 2
    text.rope_parameters["mrope_section"] = [half - 2 * (half // 4), half // 4, half // 4]
    if flat:
        layout = config.to_dict()
        layout.update({k: v for k, v in layout.pop("text_config").items() if k not in ("model_type", "architectures")})
        config = type(config).from_dict({**layout, "use_cache": True})
    torch.manual_seed(seed)
    model = getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type])(config)
    model.set_attn_implementation(attn)
    return model.eval()


def as_loaded(model_type: str, *, seed: int = 0):
    """A tiny ``model_type`` configured as its checkpoint is: ``use_cache`` at its default (True), a flat
    config where the checkpoint's is flat."""
    return tiny_vlm(model_type, seed=seed, defaults=("use_cache",), flat=model_type in FLAT_CHECKPOINTS)


def image_example(config, text_tokens: int, grids: list[tuple[int, int, int]], *, seed: int = 0) -> dict:
    """One processor-style example: half its text, then each image of ``grids`` in start/end tokens, the rest."""
    rng = torch.Generator().manual_seed(seed)
    vision = config.vision_config
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    start = getattr(config, "vision_start_token_id", None) or getattr(config, "image_start_token_id", None)
    end = getattr(config, "vision_end_token_id", None) or getattr(config, "image_end_token_id", None)
    text = torch.randint(0, 100, (text_tokens,), generator=rng).tolist()
    ids, kinds = text[: text_tokens // 2], [0] * (text_tokens // 2)
    for t, h, w in grids:
        placeholders = t * h * w // vision.spatial_merge_size**2
        ids += [start, *[config.image_token_id] * placeholders, end]
        kinds += [0, *[1] * placeholders, 0]
    ids, kinds = ids + text[text_tokens // 2 :], kinds + [0] * (text_tokens - text_tokens // 2)
    example = {"input_ids": ids, "mm_token_type_ids": kinds}
    if grids:
        patches = sum(t * h * w for t, h, w in grids)
        example["pixel_values"] = torch.randn(patches, width, generator=rng)
        example["image_grid_thw"] = torch.tensor(grids)
    return example


def mixed_examples(config) -> list[dict]:
    """Images of three sizes in two examples, and a text-only example between them."""
    return [
        image_example(config, 6, [(1, 4, 4)], seed=1),
        image_example(config, 9, [], seed=2),
        image_example(config, 5, [(1, 2, 6), (1, 4, 2)], seed=3),
    ]


def alone_logits(model, examples: list[dict]) -> torch.Tensor:
    """Each example run alone (a batch of one, the model numbering its own positions), concatenated."""
    out = []
    for example in examples:
        inputs = {k: torch.as_tensor(v)[None] for k, v in example.items() if k in ("input_ids", "mm_token_type_ids")}
        inputs.update({k: example[k] for k in ("pixel_values", "image_grid_thw") if k in example})
        out.append(model(**inputs).logits[0])
    return torch.cat(out)
