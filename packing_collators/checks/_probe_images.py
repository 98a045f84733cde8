"""An image in the packing probe of a vision-language model, so the probe measures what images go through.

    C (the example compared alone)   [ c c c <start> <img> <img> <img> <img> <end> c c c c ]
    its image                        grid (1, 2m, 2m) for a merge of m: 4m^2 patches, 4 placeholders,
                                     seeded pixels of the processor's patch width

The probe then runs the multimodal positions (``enable_packing``), the vision tower and the
placeholders' embeddings, packed and alone. Only Qwen2-VL-style models (a module with
``get_rope_index``, image placeholder and start/end tokens, a vision config with a patch size)
get one; any other model is probed on text. Cost: a 16-patch image through the vision tower.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ProbeImage", "probe_image"]


@dataclass(frozen=True)
class ProbeImage:
    """The tokens and pixels of the probe's image for one model."""

    start: int
    placeholder: int
    end: int
    merge: int
    width: int

    @property
    def token_ids(self) -> tuple[int, int, int]:
        return (self.start, self.placeholder, self.end)

    def insert(self, tokens: np.ndarray) -> np.ndarray:
        """``tokens`` with the image's start, placeholders and end in the middle."""
        middle = len(tokens) // 2
        image = [self.start, *[self.placeholder] * 4, self.end]
        return np.concatenate([tokens[:middle], np.array(image, tokens.dtype), tokens[middle:]])

    def features(self, tokens: np.ndarray, seed: int) -> dict:
        """The keys a processor gives an example holding ``tokens`` (text only when it has no placeholder)."""
        kinds = (tokens == self.placeholder).astype(np.int64)
        if not kinds.any():
            return {"mm_token_type_ids": kinds.tolist()}
        side = 2 * self.merge
        pixels = np.random.default_rng(seed).standard_normal((side * side, self.width)).astype(np.float32)
        return {"mm_token_type_ids": kinds.tolist(), "pixel_values": pixels, "image_grid_thw": [[1, side, side]]}


def probe_image(model) -> ProbeImage | None:
    """The probe's image for ``model``, or None when it is not a Qwen2-VL-style model this can give one."""
    from ..models import multimodal_model

    module = multimodal_model(model)
    config = getattr(module, "config", None)
    vision = getattr(config, "vision_config", None)
    ids = [
        getattr(config, "vision_start_token_id", None) or getattr(config, "image_start_token_id", None),
        getattr(config, "image_token_id", None),
        getattr(config, "vision_end_token_id", None) or getattr(config, "image_end_token_id", None),
    ]
    sizes = [
        getattr(vision, name, None)
        for name in ("spatial_merge_size", "in_channels", "temporal_patch_size", "patch_size")
    ]
    if module is None or any(not isinstance(v, int) for v in ids + sizes):
        return None
    merge, channels, frames, patch = sizes
    return ProbeImage(*ids, merge=merge, width=channels * frames * patch * patch)
