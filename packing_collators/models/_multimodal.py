"""Multimodal rotary positions computed per example, so a packed row of images and text is each example alone.

Qwen2-VL-style models number each token on three axes (time, height, width): an image's tokens
share a time and spread over its grid, the text after it continues from the image's largest
position. The model computes them itself (``get_rope_index``) for a whole sequence; over a packed
row it would number the second example on from the first. Here each example gets its own::

    row              [ t t <img 2x2> t | t t t | t <img 1x3> t ]          (3 examples, 2 images)
    text positions     0 1  2 2 2 2  4 | 0 1 2 | 0  1 1 1   3               restart per example
    get_rope_index     on each example with its own images' grids, concatenated
    position_ids     (4, 1, T): the text row first (transformers reads packed boundaries from it),
                     then the three rotary rows

Images and videos are assigned to examples in order: as many as the collator counted for each
(``images_per_example`` / ``videos_per_example``, which this pre-hook takes out of the call), else by
the placeholder tokens each example holds (``mm_token_type_ids``: 1 image, 2 video; or the config's
``image_token_id`` / ``video_token_id``). An example whose placeholders do not match its own images'
grids is refused by index, so two examples whose errors would cancel over the row are refused too. A batch
with no image or video at all is text, placeholder tokens included, as the model numbers it unpacked. The vision tower
already attends within each image (its ``cu_seqlens`` come from the grids). A batch of one example
(the sampler gives an example that fills its budget a micro-batch of its own) has nothing to keep
apart, but its collated ``position_ids`` (0..T-1) would stand in for the image's 3-D positions: it is
numbered the same way. A batch of several packed rows with images is refused (one row per micro-batch).
Cost: one ``get_rope_index`` call per example with an image, once per forward.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["COUNTS", "MultimodalPositions", "multimodal_model"]

_GRIDS = (("image_grid_thw", 1, "image"), ("video_grid_thw", 2, "video"))
# each example's count of grid rows, as FlatteningCollator writes them (collate/_media.py's COUNT_KEYS)
COUNTS = {"image_grid_thw": "images_per_example", "video_grid_thw": "videos_per_example"}


def multimodal_model(model):
    """The module of ``model`` that computes multimodal rotary positions (``get_rope_index``), or None."""
    for module in model.modules():
        if callable(getattr(module, "get_rope_index", None)) and hasattr(module, "config"):
            return module
    return None


class MultimodalPositions:
    """The forward pre-hook of a model's multimodal module: ``position_ids`` per example, as (4, 1, T)."""

    def __init__(self, module, state) -> None:
        self.module, self.state = module, state
        config = module.config
        self.merge = int(getattr(getattr(config, "vision_config", None), "spatial_merge_size", 2) or 2)
        self.token_ids = {1: getattr(config, "image_token_id", None), 2: getattr(config, "video_token_id", None)}

    def __call__(self, module, args, kwargs):
        counts = {key: kwargs.pop(name) for key, name in COUNTS.items() if name in kwargs}  # not the model's
        segments = self.state.segments
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None or self.state.generating:
            return args, kwargs  # generate(): the model numbers its own positions and keeps their offsets
        media = any(kwargs.get(key) is not None for key, _, _ in _GRIDS)
        text = kwargs.get("position_ids")
        if not media and segments is not None and isinstance(text, torch.Tensor) and text.shape == (1, input_ids.shape[1]):
            # text only: every rotary axis is the row's own text position (a shared prompt's layout numbers each
            # completion on from its prompt, where the segments are the keys' layout, longer than the row)
            kwargs["position_ids"] = text[None].expand(4, 1, -1)
            return args, kwargs
        if segments is None:  # not packed; but a collated single example still carries text positions
            if not (media and _counts_from_zero(kwargs.get("position_ids"), input_ids)):
                return args, kwargs
            cu = [0, input_ids.shape[1]]
        elif segments.batch_shape[0] != 1:
            if media:
                raise ValueError(
                    f"A packed batch with images or videos must be one row; this one has {segments.batch_shape[0]} "
                    "rows of packed examples, whose images' positions cannot be placed by row. Collate with "
                    "FlatteningCollator(), which puts the micro-batch in one row."
                )
            return args, kwargs
        else:
            cu = segments.layout.cu_seq_lens.tolist()
        kwargs["position_ids"] = self.positions(cu, input_ids, kwargs, counts)
        return args, kwargs

    def kinds(self, input_ids: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """int (1, T): 1 for an image placeholder, 2 for a video one, 0 for text."""
        given = kwargs.get("mm_token_type_ids")
        if given is not None:
            return given.reshape(input_ids.shape)
        kinds = torch.zeros_like(input_ids)
        for kind, token in self.token_ids.items():
            if token is not None:
                kinds[input_ids == token] = kind
        return kinds

    def positions(self, cu: list[int], input_ids: torch.Tensor, kwargs: dict, counts: dict | None = None):
        """(4, 1, T) positions of the row whose examples ``cu`` (cumulative lengths) delimits; ``counts``:
        ``{grid key: grid rows per example}`` where the collator counted them."""
        kinds = self.kinds(input_ids, kwargs)
        per_example = _assign_grids(kwargs, kinds, cu, self.merge, counts or {})
        rows = []
        for e, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
            text = torch.arange(end - start, device=input_ids.device)
            grids = per_example[e]
            if not grids:
                rows.append(torch.stack([text] * 4))
                continue
            rope, _ = self.module.get_rope_index(
                input_ids[:, start:end], mm_token_type_ids=kinds[:, start:end], attention_mask=None, **grids
            )
            rows.append(torch.cat([text[None], rope.reshape(3, -1).to(text)]))
        return torch.cat(rows, dim=1)[:, None]


def _counts_from_zero(position_ids, input_ids: torch.Tensor) -> bool:
    """Whether ``position_ids`` are one row's plain text positions 0..T-1 (what a collator gives one example)."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or input_ids.shape[0] != 1:
        return False
    width = input_ids.shape[1]
    return position_ids.shape == (1, width) and bool(
        (position_ids[0] == torch.arange(width, device=position_ids.device)).all()
    )


def _spans(tokens: list[int], placeholders: list[int], given, key: str) -> list[tuple[int, int]]:
    """Each example's rows ``(first, end)`` of the grid: ``given`` rows per example (the collator's count; the
    segments after them, a row's padding, hold none), else as many as its placeholders take, in order."""
    if given is not None:
        given = [int(n) for n in (given.tolist() if hasattr(given, "tolist") else given)]
        if len(given) > len(placeholders) or sum(given) != len(tokens):
            raise ValueError(
                f"The batch counts {given} {key} rows per example ({sum(given)} in all) for {len(placeholders)} "
                f"segments and {len(tokens)} rows: collate the examples' images with FlatteningCollator, which "
                "writes both."
            )
        ends = np.cumsum(given + [0] * (len(placeholders) - len(given))).tolist()
        return list(zip([0] + ends[:-1], ends))
    spans, taken = [], 0
    for count in placeholders:
        first, used = taken, 0
        while used < count and taken < len(tokens):
            used, taken = used + tokens[taken], taken + 1
        spans.append((first, taken))
    return spans


def _assign_grids(kwargs: dict, kinds: torch.Tensor, cu: list[int], merge: int, given: dict) -> list[dict]:
    """Each example's grid rows (and video ``second_per_grid_ts``): the collator's count of them per example
    (``given``), else taken in order by its placeholder count; refused where they do not match its placeholders.
    A batch without images or videos has none to match: its placeholder tokens (a policy may sample one) are text."""
    per_example: list[dict] = [{} for _ in range(len(cu) - 1)]
    if all(kwargs.get(key) is None for key, _, _ in _GRIDS):
        return per_example  # no image or video: placeholders are text, as the model reads them in a batch of its own
    for key, kind, word in _GRIDS:
        grid = kwargs.get(key)
        counts = torch.stack([(kinds[0, s:e] == kind).sum() for s, e in zip(cu[:-1], cu[1:])]).tolist()
        if grid is None:
            if any(counts):
                first = next(i for i, n in enumerate(counts) if n)
                raise ValueError(
                    f"Example {first} has {counts[first]} {word} placeholder tokens but the batch has no {key}: "
                    f"give each example its {word}s' pixels and {key} (the processor's output), or drop the placeholders."
                )
            continue
        tokens = (grid.prod(-1) // (merge * merge)).tolist()
        spans = _spans(tokens, counts, given.get(key), key)
        taken = spans[-1][1] if spans else 0
        for e, (count, (first, end)) in enumerate(zip(counts, spans)):
            used = sum(tokens[first:end])
            if used != count:
                own = f"{key} rows {first}..{end - 1}: {grid[first:end].tolist()}" if end > first else f"no {key} row"
                raise ValueError(
                    f"Example {e} has {count} {word} placeholder tokens, but its {word}s' grids ({own}) need {used}. "
                    f"Each {word} needs t*h*w/{merge * merge} placeholders: tokenize with the model's processor, "
                    "which writes both."
                )
            if count:
                per_example[e][key] = grid[first:end]
                seconds = kwargs.get("second_per_grid_ts") if kind == 2 else None
                if seconds is not None:
                    per_example[e]["second_per_grid_ts"] = seconds[first:end]
        if taken != len(tokens):
            raise ValueError(
                f"The batch has {len(tokens)} {word}s ({key} rows) but its examples hold placeholders for {taken}: "
                f"{word} {taken} has no placeholder tokens. Keep each {word}'s placeholders in its example."
            )
    return per_example
