"""What an example with images costs beside its tokens: the patches its vision tower runs on.

    example   input_ids 300 tokens (64 of them image placeholders)   image_grid_thw [[1, 16, 16]]
    cost      300 + 1 * 16 * 16 = 556                                (text tokens + vision patches)

A packed micro-batch of a vision-language model holds its text tokens and, through the vision
tower, every patch of its images (``t * h * w`` per image, four times the placeholders under a
2x2 merge); the sampler fills its token budget with both, so the budget holds in GPU memory
whatever the images' sizes. Read from the ``image_grid_thw`` / ``video_grid_thw`` columns a
processor writes. Cost: one pass over those columns (Arrow's buffers for a ``datasets.Dataset``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GRID_COLUMNS", "vision_patches"]

GRID_COLUMNS = ("image_grid_thw", "video_grid_thw")


def _arrow_patches(column) -> np.ndarray:
    """Patches per row of a list<list<int>> Arrow column of (t, h, w) grids (0 for a row without one)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    offsets = column.offsets.to_numpy()
    triples = pc.list_flatten(pc.list_flatten(column)).to_numpy(zero_copy_only=False).astype(np.int64)
    per_grid = triples.reshape(-1, 3).prod(axis=1)
    sums = np.r_[0, np.cumsum(per_grid)]
    return (sums[offsets[1:]] - sums[offsets[:-1]]).astype(np.int64)


def vision_patches(dataset: Any, count: int, table=None, row_order=None) -> np.ndarray:
    """int64 (count,) vision-tower patches per example (0 without images), from the grid columns of the
    Arrow ``table`` behind ``dataset`` (rows in ``row_order``) or, without one, of each example.

    >>> vision_patches([{"input_ids": [1, 2], "image_grid_thw": [[1, 4, 4]]}, {"input_ids": [3]}], 2).tolist()
    [16, 0]
    """
    total = np.zeros(count, np.int64)
    for column in GRID_COLUMNS:
        if table is not None:
            if column in table.column_names:
                patches = _arrow_patches(table.column(column))
                total += patches if row_order is None else patches[row_order]
            continue
        for i in range(count):
            grid = dataset[i].get(column) if hasattr(dataset[i], "get") else None
            if grid is not None:
                total[i] += int(np.asarray(grid, np.int64).reshape(-1, 3).prod(axis=1).sum())
    return total
