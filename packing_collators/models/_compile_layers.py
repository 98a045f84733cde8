"""The decoder layers compiled in place (``compile_layers``; PackingTrainer under ``torch_compile=True``).

    model.model.layers[i].forward = compiled(type(layer).forward), bound to layer i   (one code object:
                                    a graph compiled for layer 0 serves every layer of its class)
    embeddings, final norm, the loss   eager; the chunked loss runs its own compiled chunk
    accelerate's whole-model torch.compile   skipped by PackingTrainer's prepare (the layers are compiled)

Why not the whole model (what the stock Trainer compiles): the loss never holds the full logits
because it projects only the tokens that have a target, a selection whose size depends on the data,
which breaks a whole-model graph; compiled whole, the model had to keep the full-logit loss. The
layers hold almost all of a step's element-wise work (norms, rotary embeddings, the MLP's
activation), which is what compiling fuses; the rest is a few kernels a step.

The compiled forward is bound with ``types.MethodType``, so ``copy.deepcopy`` of the model (a
reference model) binds it to the copy's layer, and the copy runs its own weights. Traced with dynamic
shapes: a new row length or number of examples does not recompile; gradients on or off, checkpointing's
recompute and the live probe's calls each add a graph (a handful per run). Inside ``bucket_rows()``
(PackingTrainer's compiled training steps, their rows padded to a bucket) a second compiled function
traces the row length static, the number of examples still symbolic: faster steps (docs/benchmarks.md,
8B under FSDP2). Cost: those compiles, seconds each, before the first step under PackingTrainer
(``trainer/_compile.py``), in the first steps otherwise.
Activation checkpointing: transformers 5.15-5.17 checkpoint in the layer's ``__call__``, around the compiled
forward; 5.24 on wraps the class's ``forward``, so the checkpoint is traced inside the graph (equal losses and
gradients on the CPU; the GPU runs used 5.17). 5.25's layers set a global in their forward (``kernels``'
rotary routing) and put it back; Dynamo is told not to replay that in the recompute, else it refuses to trace
the checkpoint and the layer runs eager. Measured against TRL: docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import types

from .._compat import (
    checkpoint_side_effects_not_replayed,
    dynamo_counters,
    dynamo_sources_by_pattern,
    raise_recompile_limit,
)
from ..batch import CU_SEQ_LENS_K, CU_SEQ_LENS_Q, MAX_LENGTH_K, MAX_LENGTH_Q, VARLEN_KEYS

__all__ = [
    "auto_compile_blocker",
    "bucket_rows",
    "checkpointed_layers",
    "compile_layers",
    "compiled_layer_count",
    "compiled_step_failure",
    "graphs_compiled",
    "layer_compile_blocker",
    "repeated_layers",
    "symbolic_packing_sizes",
    "uncompile_layers",
]

_COMPILED = "_packing_compiled_forward"  # marks a layer whose forward this module compiled
# graphs per compiled forward: the live probe's (forward only, with and without the packed keys, gradients on and
# off) and training's (checkpointing's recompute too) pass Dynamo's default of 8, after which calls run eager
RECOMPILE_LIMIT = 32
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that replay CUDA graphs


def repeated_layers(model) -> list:
    """The model's repeated blocks: an ``nn.ModuleList`` whose children are all of one class, the
    outermost such list (the decoder layers, not a layer's experts), the class the model names in
    ``_no_split_modules`` (transformers' own decoder-layer list) first where it names one.

    >>> import torch
    >>> experts = lambda: torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(8)])
    >>> layer = lambda: torch.nn.ModuleDict({"experts": experts()})
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ModuleList([layer(), layer()]))
    >>> [type(m).__name__ for m in repeated_layers(model)]
    ['ModuleDict', 'ModuleDict']
    """
    import torch

    named = set(getattr(model, "_no_split_modules", None) or ())
    found: list[tuple[bool, int, list]] = []  # (not named, depth, children)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) >= 2:
            children = list(module)
            if len({type(child) for child in children}) == 1:
                depth = name.count(".") + 1 if name else 0
                found.append((type(children[0]).__name__ not in named, depth, children))
    return min(found, key=lambda f: (f[0], f[1], -len(f[2])))[2] if found else []


def _marked(module) -> bool:
    """Whether :func:`compile_layers` compiled this module's own forward: its own attribute, not one that a wrapper
    (``checkpoint_wrapper``, which accelerate's FSDP2 puts around a layer) passes through from the layer inside."""
    return bool(vars(module).get(_COMPILED, False))


# which graphs a compiled layer's call runs: the row length static inside bucket_rows (True), else dynamic; a
# context variable, so a thread or task outside the training loop (an evaluation, a probe) keeps its own
_STATIC_ROWS: contextvars.ContextVar[bool] = contextvars.ContextVar("packing_collators_static_rows", default=False)


@contextlib.contextmanager
def bucket_rows():
    """Calls of the layers :func:`compile_layers` compiled trace the row length static inside: a graph per row
    length, the packing sizes (``cu_seq_lens``, ``max_length``) symbolic, so a new number of examples does not
    recompile. For rows padded to a few lengths (PackingTrainer's buckets, its training steps); elsewhere a call
    takes the dynamic graphs. Static, the kernels are faster (docs/benchmarks.md, 8B under FSDP2). Keep the backward
    inside too: a checkpoint around the compiled forward (transformers 5.15-5.17) recomputes it there. It holds
    for the thread (or asyncio task) that entered it, not for others.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]))
    >>> _ = compile_layers(model, backend="eager")
    >>> with bucket_rows():
    ...     static = model[0][0](torch.ones(1, 3, 2))
    >>> bool(torch.equal(static, model[0][0](torch.ones(1, 3, 2))))
    True
    """
    entered = _STATIC_ROWS.set(True)
    try:
        with symbolic_packing_sizes():
            yield
    finally:
        _STATIC_ROWS.reset(entered)


@functools.lru_cache(maxsize=None)
def _compiled_forward(cls, options: tuple, checkpoint: bool = False):
    """One compiled forward per class and options, every layer of the class sharing its graphs: it calls the layer's
    class's forward as the class is at the call; ``checkpoint``: under ``torch.utils.checkpoint`` (non-reentrant,
    RNG state kept) inside the graph. Two compiled functions behind it, two code objects, so Dynamo keeps their
    graphs apart (it tries a function's newest graph first, and a dynamic one would take the static shapes' calls):
    dynamic shapes, and inside :func:`bucket_rows` the row length static."""
    import torch

    def run(self, args, kwargs):
        # the class's forward looked up at the call: FSDP2 swaps a layer's class for a subclass, and transformers'
        # checkpointing (5.24: in the class's forward) checkpoints only in the outermost class's forward
        if checkpoint:
            return torch.utils.checkpoint.checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)
        return type(self).forward(self, *args, **kwargs)

    def any_rows(self, *args, **kwargs):
        return run(self, args, kwargs)

    def static_rows(self, *args, **kwargs):  # traced under bucket_rows' symbolic packing sizes
        return run(self, args, kwargs)

    dynamic = torch.compile(any_rows, dynamic=True, **dict(options))
    # static shapes but the packing sizes (a graph per row length); where Dynamo cannot be told those from the first
    # trace (before torch 2.8), automatic dynamic shapes make them symbolic at the second count
    static = torch.compile(static_rows, dynamic=False if dynamo_sources_by_pattern() else None, **dict(options))

    @functools.wraps(cls.forward)  # the class's signature and source, for whoever inspects the layer's forward
    def forward(self, *args, **kwargs):
        with checkpoint_side_effects_not_replayed():  # transformers 5.25's layers set a global in their forward
            return (static if _STATIC_ROWS.get() else dynamic)(self, *args, **kwargs)

    return forward


def compile_layers(model, *, backend: str | None = None, mode: str | None = None, checkpoint: bool = False) -> int:
    """Compile ``model``'s repeated decoder layers in place (``torch.compile`` of their forward); returns how many.

    ``checkpoint``: each layer's activations checkpointed inside its graph (``torch.utils.checkpoint``,
    non-reentrant, the RNG state kept for the recompute), as ``torch.compile`` of a checkpointed layer traces it:
    the compiler plans the recompute with the backward. Use it instead of a checkpoint around the compiled
    forward (accelerate's FSDP ``activation_checkpointing`` wrapper, transformers' checkpointing before 5.24,
    which checkpoints in the layer's call), which trains slower (docs/benchmarks.md, 8B under FSDP2).

    Layers compiled before are left as they are. The model's parameters, state dict and hooks are
    unchanged; each layer's ``forward`` becomes its class's compiled forward bound to it, traced with
    dynamic shapes (a new row length or example count does not recompile), or inside :func:`bucket_rows`
    with the row length static (rows padded to a bucket: faster kernels), and Dynamo may keep up to
    ``RECOMPILE_LIMIT`` graphs of each. The stock Trainer's
    ``torch_compile=True`` compiles the whole model instead: with ``enable_chunked_loss``, leave it off
    and call this.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]))
    >>> compile_layers(model, backend="eager"), compile_layers(model, backend="eager"), compiled_layer_count(model)
    (2, 0, 2)
    >>> layer = model[0][1]
    >>> bool(torch.equal(layer(torch.ones(1, 2)), torch.nn.functional.linear(torch.ones(1, 2), layer.weight, layer.bias)))
    True
    """
    if mode in CUDA_GRAPH_MODES:
        raise ValueError(
            f"compile_layers(mode={mode!r}): this mode replays CUDA graphs, and every layer shares one compiled "
            "forward, so a layer's replay would overwrite the output of the one before. Use mode=None (the default) "
            "or 'max-autotune-no-cudagraphs'."
        )
    options = tuple(sorted((k, v) for k, v in {"backend": backend, "mode": mode}.items() if v is not None))
    count = 0
    for layer in repeated_layers(model):
        if _marked(layer):
            continue
        layer.forward = types.MethodType(_compiled_forward(type(layer), options, checkpoint), layer)
        setattr(layer, _COMPILED, "checkpointed" if checkpoint else True)
        count += 1
    if count:
        raise_recompile_limit(RECOMPILE_LIMIT)
    return count


def compiled_layer_count(model) -> int:
    """How many of ``model``'s modules have a forward :func:`compile_layers` compiled (0 for an eager model).

    >>> import torch
    >>> compiled_layer_count(torch.nn.Linear(2, 2))
    0
    """
    return sum(_marked(module) for module in model.modules())


def checkpointed_layers(model) -> int:
    """How many of ``model``'s layers :func:`compile_layers` compiled with their checkpoint inside the graph.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]))
    >>> compile_layers(model, backend="eager", checkpoint=True), checkpointed_layers(model)
    (2, 2)
    """
    return sum(vars(module).get(_COMPILED) == "checkpointed" for module in model.modules())


def layer_compile_blocker(model, *, mode: str | None = None) -> str:
    """Why ``model``'s layers cannot be compiled one by one under ``mode`` ("" when they can): compile it whole.

    >>> import torch
    >>> layer_compile_blocker(torch.nn.Linear(2, 2))
    'the model has no repeated layers'
    """
    from ._enable import packing_layers

    if mode in CUDA_GRAPH_MODES:
        return f"mode={mode!r} replays CUDA graphs, which layers sharing one compiled forward cannot"

    layers = packing_layers(model)
    if layers is not None and (layers.stateful or layers.multimodal):
        return "enable_packing prepared layers that read the forward's scope"
    blocks = repeated_layers(model)
    if not blocks:
        return "the model has no repeated layers"
    named = set(getattr(model, "_no_split_modules", None) or ())
    if named and type(blocks[0]).__name__ not in named:
        return f"its repeated {type(blocks[0]).__name__} blocks are not the layers it names ({', '.join(sorted(named))})"
    from ..fused import swapped_here  # the library's fused forwards run torch's ops under torch.compile

    replaced = [
        type(module).__name__
        for block in blocks
        for module in block.modules()
        if "forward" in vars(module) and not _marked(module) and not swapped_here(module)
    ]
    if replaced:
        return f"the forward of {replaced[0]} inside a layer was replaced"
    return ""


def uncompile_layers(model) -> int:
    """Undo :func:`compile_layers`: each compiled layer runs its class's eager forward again; returns how many.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]))
    >>> compile_layers(model, backend="eager"), uncompile_layers(model), compiled_layer_count(model)
    (2, 2, 0)
    """
    count = 0
    for module in model.modules():
        if _marked(module):
            delattr(module, "forward")
            delattr(module, _COMPILED)
            count += 1
    return count


def auto_compile_blocker(model, device=None) -> str:
    """Why PackingTrainer's ``compile_layers="auto"`` leaves ``model`` eager ("" when it compiles the layers): only
    an unquantized model without adapters, trained on a CUDA GPU (``device``, default its parameters') where
    Inductor compiles, whose layers compile one by one.

    >>> import torch
    >>> auto_compile_blocker(torch.nn.Linear(2, 2))
    'the model does not train on a CUDA GPU'
    """
    import torch

    if getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None:
        return "the model is quantized"
    if getattr(model, "peft_config", None) or getattr(model, "_hf_peft_config_loaded", False):
        return "the model carries PEFT adapters"
    parameter = next(iter(model.parameters()), None)
    device = torch.device(device) if device is not None else getattr(parameter, "device", None)
    if device is None or device.type != "cuda":
        return "the model does not train on a CUDA GPU"
    return layer_compile_blocker(model) or _inductor_blocker(device.index or 0, parameter.dtype)


@functools.lru_cache(maxsize=None)
def _inductor_blocker(device: int, dtype) -> str:
    """Why Inductor cannot compile a step like a layer's on this GPU, forward and backward ("" when it can): no
    Triton, no C compiler, a dtype its kernels do not take, ..."""
    import torch

    def step(x, w):
        return torch.nn.functional.silu(x @ w).float().pow(2).mean()

    try:
        x, w = (torch.ones(16, 16, device=f"cuda:{device}", dtype=dtype, requires_grad=True) for _ in range(2))
        torch.compile(step)(x, w).backward()
    except Exception as error:  # noqa: BLE001 - any failure: the model trains eager, the reason logged
        return f"torch.compile fails on this machine ({type(error).__name__}: {str(error).strip()[:200]})"
    return ""


def compiled_step_failure(model, devices: tuple[str, ...] = ("cuda",), autocast=None) -> str:
    """Why one training forward and backward of ``model`` (its compiled layers) fails on a packed row of two
    examples, on the model's own device where it is one of ``devices`` ("" when it runs, or the device is not one);
    the forward under ``autocast`` (the Trainer's, ``trainer/_autocast.py``: float32 weights with ``bf16=True``
    give a flash kernel the half activations training does);
    the random state and the model's gradients are left as they were: the backward runs through every layer to
    the first layer's weight alone (``torch.autograd.grad``), so no parameter's gradient is kept.

    >>> import torch
    >>> compiled_step_failure(torch.nn.Linear(2, 2))  # on the CPU: not run
    ''
    """
    import torch

    parameter = next(iter(model.parameters()), None)
    if parameter is None or parameter.device.type not in devices:
        return ""
    config = getattr(model, "config", None)
    vocab = getattr(getattr(config, "get_text_config", lambda: config)(), "vocab_size", None) or 2
    device = parameter.device
    cu = torch.tensor([0, 8, 16], dtype=torch.int32, device=device)
    batch = {"input_ids": (torch.arange(16, device=device) % vocab)[None],
             "position_ids": torch.arange(8, device=device).repeat(2)[None],
             CU_SEQ_LENS_Q: cu, CU_SEQ_LENS_K: cu, MAX_LENGTH_Q: 8, MAX_LENGTH_K: 8}  # fmt: skip
    layers = repeated_layers(model)
    trained = [p for m in (layers[:1] or [model]) for p in m.parameters() if p.requires_grad][:1]
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), symbolic_packing_sizes():
            with autocast or contextlib.nullcontext():
                loss = model(**batch, use_cache=False).logits.float().sum()
            if trained:  # back through every layer to the first one's weight; no other gradient is kept
                torch.autograd.grad(loss, trained)
    except Exception as error:  # noqa: BLE001 - any failure: the caller trains eager, with this reason
        first = (str(error).strip().splitlines() or [""])[0]
        return f"a compiled step failed ({type(error).__name__}: {first[:200]})"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return ""


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (Dynamo's counters).

    >>> graphs_compiled() >= 0
    True
    """
    return int(dynamo_counters()["stats"]["unique_graphs"])


PACKING_SOURCES = r".*\['(" + "|".join(VARLEN_KEYS) + r")'\]"
"""The batch keys Dynamo should take as dynamic from the first trace (a ``dynamic_sources`` regex)."""


@contextlib.contextmanager
def symbolic_packing_sizes():
    """Trace ``cu_seq_lens_q/k`` and ``max_length_q/k`` as dynamic from the first compile on.

    Without it Dynamo compiles a static graph first and a dynamic one at the next batch (automatic
    dynamic shapes): one compile saved. Needs ``torch.compiler.config.dynamic_sources`` with regex
    entries (torch 2.8 on: ``dynamo_sources_by_pattern``); elsewhere a no-op (the second compile then happens in
    the warm-up).

    >>> with symbolic_packing_sizes():
    ...     pass
    """
    import torch

    if not dynamo_sources_by_pattern():
        yield
        return
    config = torch.compiler.config
    sources = ",".join(filter(None, [config.dynamic_sources, PACKING_SOURCES]))
    with config.patch(dynamic_sources=sources):
        yield
