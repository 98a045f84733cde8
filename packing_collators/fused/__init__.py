"""Eager layers on fused kernels: what transformers runs op by op where the layers are not compiled.

_norms.py           fuse_rms_norms(model): the RMSNorms that compute rms_norm, on torch's fused kernel
_mlp.py             fuse_swiglu(model): the gated MLPs' silu(gate) * up as one Triton kernel each way
_swiglu_kernels.py  its kernels (Triton, imported where they run)
_rope.py            fuse_rope(model): the rotary embedding of queries and keys as one Triton kernel each way
_rope_kernels.py    its kernel
_swap.py            swap_forwards: the one way a recognised module gets its fused forward (idempotent);
                    swapped_here(module): whether its forward is one of these (compile_layers compiles those layers)

Each is measured on what it replaces (a probe input through the module's own forward, or the family's own function)
and opt-in: one line before the Trainer. Under ``torch.compile`` Inductor fuses the same ops, and these keep torch's
there. Imports nothing of the package's other folders but the top-level kernel check.
"""

from ._mlp import fuse_swiglu, swiglu
from ._norms import fuse_rms_norms
from ._rope import fuse_rope, unfuse_rope
from ._swap import swapped_here

__all__ = ["fuse_rms_norms", "fuse_rope", "fuse_swiglu", "swapped_here", "swiglu", "unfuse_rope"]
