"""Images and videos of processor-style examples, concatenated in example order beside the flat row.

A Qwen2-VL-style processor gives each example its patches and their grids; a batch holds every
image's patches one after the other, and the grids in the same order::

    example 0   pixel_values (64, 1176)    image_grid_thw [[1, 8, 8]]
    example 1   (text only)
    example 2   pixel_values (144, 1176)   image_grid_thw [[1, 8, 12], [1, 4, 12]]
    batch       pixel_values (208, 1176)   image_grid_thw [[1, 8, 8], [1, 8, 12], [1, 4, 12]]
                images_per_example [1, 0, 2]                  int64 (examples,)

The same for ``pixel_values_videos`` / ``video_grid_thw`` (and Qwen2.5-VL's ``second_per_grid_ts``,
one per video, and ``videos_per_example``). Each example's patches must be what its grids say (t * h * w
rows); an example with pixels and no grid, or a grid and no pixels, is refused by index. The vision
tower then sees each image alone (its attention reads the grids), and ``enable_packing`` numbers each
example's rotary positions on its own, with the images ``images_per_example`` gives it (its pre-hook
takes the two counts out of the call: the model never sees them). Cost: one concatenation per key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["COUNT_KEYS", "MEDIA_KEYS", "read_media"]

_PIXELS_TO_GRID = {"pixel_values": "image_grid_thw", "pixel_values_videos": "video_grid_thw"}
MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
# how many of the batch's grid rows each example holds, in example order (enable_packing reads them)
COUNT_KEYS = {"image_grid_thw": "images_per_example", "video_grid_thw": "videos_per_example"}


def _rows(value, what: str, index: int, item: str):
    """A 2-D array or tensor (kept as it is: torch stays torch, its dtype too), numpy for the rest."""
    if hasattr(value, "detach"):
        value = value.detach()
    elif not isinstance(value, np.ndarray):
        value = np.asarray(value)
    if value.ndim != 2:
        raise ValueError(
            f"{item} {index}: {what} has shape {tuple(value.shape)}, not (patches, features) with a grid: packing "
            "carries Qwen2-VL-style patches (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, Qwen3.5). Per-image tensors "
            "of LLaVA-style models are not packed: train those padded."
        )
    return value


def _concat(pieces: list):
    if any(hasattr(p, "detach") for p in pieces):
        import torch

        return torch.cat([torch.as_tensor(p) for p in pieces])
    return np.concatenate(pieces)


def _one_kind(features: Sequence[Mapping[str, Any]], pixels_key: str, grid_key: str, item: str) -> dict[str, Any]:
    pixels, grids, seconds = [], [], []
    counts = np.zeros(len(features), np.int64)
    for i, feature in enumerate(features):
        p, g = feature.get(pixels_key), feature.get(grid_key)
        if p is None and g is None:
            continue
        if g is None or p is None:
            have, lack = (pixels_key, grid_key) if g is None else (grid_key, pixels_key)
            raise ValueError(
                f"{item} {i} has {have} but no {lack}: an image needs both (the processor returns them together). "
                f"Keep both columns, or drop the example's {pixels_key.replace('pixel_values', 'image')}s."
            )
        grid = np.asarray(g.cpu() if hasattr(g, "cpu") else g, dtype=np.int64).reshape(-1, 3)
        rows = _rows(p, pixels_key, i, item)
        need = int(grid.prod(-1).sum())
        if rows.shape[0] != need:
            raise ValueError(
                f"{item} {i}: {pixels_key} has {rows.shape[0]} patches but its {grid_key} {grid.tolist()} needs "
                f"{need} (t*h*w per image). Keep each example's pixels and grids as its processor returned them."
            )
        pixels.append(rows)
        grids.append(grid)
        counts[i] = len(grid)
        if grid_key == "video_grid_thw" and feature.get("second_per_grid_ts") is not None:
            seconds.append(np.asarray(feature["second_per_grid_ts"], dtype=np.float32).reshape(-1))
    if not grids:
        return {}
    out = {pixels_key: _concat(pixels), grid_key: np.concatenate(grids), COUNT_KEYS[grid_key]: counts}
    if seconds:
        if len(seconds) != len(grids):
            raise ValueError(
                f"Some {item.lower()}s with videos have second_per_grid_ts and others not; give all or none."
            )
        out["second_per_grid_ts"] = np.concatenate(seconds)
    return out


def read_media(features: Sequence[Mapping[str, Any]], *, item: str = "Example") -> dict[str, Any]:
    """The batch's image and video keys: each example's patches and grids, concatenated in example order,
    and how many images (videos) each example holds.

    >>> media = read_media([{"pixel_values": np.ones((4, 6)), "image_grid_thw": [[1, 2, 2]]}, {},
    ...                     {"pixel_values": np.zeros((8, 6)), "image_grid_thw": [[1, 2, 4]]}])
    >>> media["pixel_values"].shape, media["image_grid_thw"].tolist(), media["images_per_example"].tolist()
    ((12, 6), [[1, 2, 2], [1, 2, 4]], [1, 0, 1])
    >>> read_media([{"pixel_values": np.ones((3, 6)), "image_grid_thw": [[1, 2, 2]]}])
    Traceback (most recent call last):
    ...
    ValueError: Example 0: pixel_values has 3 patches but its image_grid_thw [[1, 2, 2]] needs 4 (t*h*w per image). Keep each example's pixels and grids as its processor returned them.
    """
    out: dict[str, Any] = {}
    for pixels_key, grid_key in _PIXELS_TO_GRID.items():
        out.update(_one_kind(features, pixels_key, grid_key, item))
    return out
