"""Models whose layers need more than positions to keep packed examples apart: hybrids and VLMs.

_row_segments.py    RowSegments: the batch's examples (read by packing_collators.batch's rule) as padded batches and back
_mixers.py          find_stateful_layers: the layers that carry state along the sequence, by structure
_scope.py           the forward's scope: one call's examples, opened and closed by the model's hooks
_per_example.py     run_per_example: the exact path for any such layer, its arguments read by name
_kernels.py         VarlenKernels: flash-linear-attention's varlen kernels (cu_seqlens), found once, or references
_gated_deltanet.py  Gated DeltaNet on the varlen kernels (a shared prompt once, from its final state)
_shared_prefix.py   a shared-prompt row through a recurrence: the prompts, then the completions from their states
_mamba2.py          Mamba2 (Nemotron-H, Granite-4.0-H, Falcon-H1, Bamba, Zamba2) on the varlen kernels
_short_conv.py      gated short convolutions (LFM2, LFM2-MoE, LFM3) on the varlen conv
_kda.py             Kimi Delta Attention (Kimi-Linear, Bailing-hybrid) on the varlen kernels
_lightning.py       lightning attention (MiniMax) on the varlen simple-GLA kernel
_varlen.py          which layers take a varlen path, and the call that runs one
_packed_mask.py     causal attention masks intersected with the examples (a model that builds them without)
_shared_mask.py     the dense mask of a shared-prompt batch under sdpa/eager, sliding the model's windows
_multimodal.py      multimodal rotary positions per example (the model's own get_rope_index)
_wrappers.py        PEFT prompt and prefix tuning: refused (a prompt per row, not per example)
_enable.py          enable_packing(model): installs each layer's path and the hooks, where missing
_compile_layers.py  compile_layers(model): the decoder layers compiled in place, one graph for all of them;
                    bucket_rows(): their row length traced static (rows padded to a bucket)

Imports nothing of the package's other folders but the packed batch's home (``batch/``: its keys and
the one rule that reads a batch's examples) and the top-level helpers; ``checks/`` and ``trainer/`` build on it.
"""

from . import _compile_layers
from ._compile_layers import *  # noqa: F403 (its __all__ is the folder's, once)
from ._enable import PackingLayers, enable_packing, packing_layers
from ._mixers import find_stateful_layers
from ._multimodal import multimodal_model
from ._packed_mask import keys_layout_mask
from ._row_segments import RowSegments, row_segments
from ._shared_mask import SHARED_ATTENTION, shared_mask, sliding_windows, with_shared_mask
from ._wrappers import refuse_prompt_learning

__all__ = [  # noqa: RUF022 (compile's names, then the rest)
    *_compile_layers.__all__,
    "SHARED_ATTENTION",
    "PackingLayers",
    "RowSegments",
    "enable_packing",
    "find_stateful_layers",
    "keys_layout_mask",
    "multimodal_model",
    "packing_layers",
    "refuse_prompt_learning",
    "row_segments",
    "shared_mask",
    "sliding_windows",
    "with_shared_mask",
]
