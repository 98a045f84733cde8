"""Models whose layers need more than positions to keep packed examples apart: hybrids and VLMs.

_row_segments.py    RowSegments: where each example of a batch sits; the row as padded batches and back
_mixers.py          find_stateful_layers: the layers that carry state along the sequence, by structure
_per_example.py     run_per_example: the exact path for any such layer (no kernel package needed)
_gated_deltanet.py  Gated DeltaNet on flash-linear-attention's varlen kernels (cu_seqlens)
_packed_mask.py     causal attention masks intersected with the examples (a model that builds them without)
_multimodal.py      multimodal rotary positions per example (the model's own get_rope_index)
_enable.py          enable_packing(model): reads the boundaries once per forward, gives each layer its path

Imports nothing of the package's other folders (the top-level helpers only); ``checks/`` and
``trainer/`` build on it.
"""

from ._enable import PackingLayers, enable_packing, packing_layers
from ._mixers import find_stateful_layers
from ._multimodal import multimodal_model
from ._row_segments import RowSegments, row_segments

__all__ = [
    "PackingLayers",
    "RowSegments",
    "enable_packing",
    "find_stateful_layers",
    "multimodal_model",
    "packing_layers",
    "row_segments",
]
