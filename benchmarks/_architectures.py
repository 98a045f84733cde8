"""Every causal-LM architecture of the installed transformers as a tiny model, and the sweep's rows over them.

The one home of the tiny configs (2 layers, hidden 32, 4 heads, vocab 128: ``GENERIC`` below, a few
``SPECIAL`` cases on top; hybrids' state sizes included) and of what a sweep row measures: for a
model type and an attention implementation, ``sweep_model`` builds the model (float32, CPU, seeded,
``use_cache=False``) and records

    verdict          accepted / refused / cannot build / not supported / error
    loss difference  |packed - padded| / |padded|, the loss on four random examples (7, 12, 5, 9
                     tokens) collated by FlatteningCollator vs right-padded with an attention_mask
    reason           why it was refused (static check or probe) or what failed

``scripts/architecture_sweep.py`` runs it over every causal LM and writes the table; the tests build
their tiny hybrids, MoEs and VLMs here and run the sweep on a few architectures (``tests/conftest.py``
puts this folder on ``sys.path``, as for ``_lengths.py``). Cost: 0.01-4 s per model and implementation.
"""


from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings

import numpy as np
from _shared import padded_batch

ATTENTIONS = ("eager", "sdpa", "flex_attention")
LENGTHS = (7, 12, 5, 9)
VOCAB = 128
WRONG = 1e-5  # relative loss difference above which an accepted row is wrong
VERDICTS = ("accepted", "refused", "cannot build", "not supported", "error")
MAX_PARAMETERS = 10_000_000  # a "tiny" model over this kept a size the tables do not shrink

# Size attributes, set wherever a config has them (its dataclass fields), sub-configs included.
GENERIC = {
    "vocab_size": VOCAB,
    "unpadded_vocab_size": VOCAB,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 8,
    # width
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "dim": 32,
    "embed_dim": 32,
    "emb_dim": 32,
    # depth (a config with per-layer lists gets one layer per distinct kind instead: _layer_plan)
    "num_hidden_layers": 2,
    "n_layer": 2,
    "num_layers": 2,
    "n_layers": 2,
    "decoder_layers": 2,
    "encoder_layers": 2,
    # heads
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "num_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "attention_head_dim": 8,
    "num_attention_heads_per_layer": 4,
    # feed-forward
    "intermediate_size": 64,
    "ffn_dim": 64,
    "n_inner": 64,
    "decoder_ffn_dim": 64,
    "encoder_ffn_dim": 64,
    "d_ff": 64,
    "ffn_hidden_size": 64,
    "rotary_dim": 4,
    # positions; local windows and chunks shorter than the examples, so that they are exercised packed
    "max_position_embeddings": 128,
    "n_positions": 128,
    "n_ctx": 128,
    "sliding_window": 4,
    "sliding_window_size": 4,
    "window_size": 4,
    "attention_chunk_size": 4,
    "local_attention_window_len": 4,
    # mixture of experts: 4 experts, 2 per token, the first layer dense and the second sparse
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "moe_k": 2,
    "moe_topk": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "expert_ffn_hidden_size": 32,
    "zero_expert_num": 2,
    # multi-head latent attention
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "qk_head_dim": 16,
    # state-space / linear attention
    "mamba_d_state": 8,
    "state_size": 8,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    # training behaviour
    "use_cache": False,
    "initializer_range": 0.2,
}
_MLA = {"num_key_value_heads": 4}  # latent attention has as many key/value heads as query heads
# model_type: overrides on top of GENERIC, where the generic sizes do not build or do not fit together.
SPECIAL: dict[str, dict] = {
    **dict.fromkeys(
        (
            "axk1",
            "axk2",
            "deepseek_v2",
            "deepseek_v3",
            "deepseek_v32",
            "glm4_moe_lite",
            "glm_moe_dsa",
            "minicpm3",
            "sarvam_mla",
            "youtu",
            "dots3_note",
            "dots3_note_text",
            "longcat_flash",
        ),
        _MLA,
    ),
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "recurrent_gemma": {"num_hidden_layers": 3},  # block_types (recurrent, recurrent, attention) repeats
    "zaya": {"num_experts_per_tok": 1},  # ZAYA supports top-1 routing only
    "mamba2": {"num_heads": 8, "head_dim": 8, "n_groups": 1},  # hidden * expand == heads * head_dim
    "falcon_h1": {"mamba_d_ssm": 64, "mamba_n_heads": 8, "mamba_d_head": 8},
    "blt": {"encoder_hash_byte_group_vocab": 64, "hidden_size_global": 32},
    "roc_bert": {"shape_vocab_size": 16, "pronunciation_vocab_size": 16},
    "gemma4_assistant": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0},  # no per-layer inputs
    "gemma3n_text": {"num_kv_shared_layers": 0},
    "gemma3n": {"num_kv_shared_layers": 0},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # the default leaves them to the checkpoint
    "lfm2": {"layer_types": ["conv", "full_attention"]},  # the default's first layers are all attention
    # hybrids: state-space / linear-attention sizes of their own, and an attention layer beside the recurrent one
    "nemotron_h": {"mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 1, "ssm_state_size": 8},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},  # its mask ignores positions
    "kimi_linear": {"linear_head_dim": 8, "linear_num_heads": 4, "num_hidden_layers": 3},
    "bailing_hybrid": {"linear_head_dim": 8, "linear_num_heads": 4, "num_key_value_heads": 4},
    **dict.fromkeys(
        ("qwen4_exp_text", "qwen4_exp"),
        {
            "layer_types": ["linear_attention", "full_attention"],
            "ple_layer_ids": [1],  # per-layer n-gram embeddings with a dilated short conv on the first layer
            "eos_token_id": 1,
            "hc_lowrank": 8,
            "ngram_vocab_size_base": 1000,
            "split_ngram_parts": 1,
            "heads_per_ngram": 2,
            "make_ngram_vocab_size_divisible_by": 8,
            "indexer_n_heads": 2,
            "indexer_kv_heads": 1,
            "indexer_head_dim": 8,
            "indexer_budget": 8,
            "indexer_compress_ratio": 4,
        },
    ),
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},  # shared block
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "reformer": {"is_decoder": True, "axial_pos_shape": [8, 16], "axial_pos_embds_dim": [16, 16]},
}
# Per-layer lists of layer indices (not of kinds): renumbered to the layers kept.
_INDEX_LISTS = frozenset(
    {"full_attn_idxs", "moe_layers", "mlp_only_layers", "cross_attention_layers", "global_attn_indexes"}
)
_DEPTH = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")


def _fields(config) -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set(vars(config))


def _get(config, name: str):
    """``config.name``, or None (heterogeneous configs refuse some global reads)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001
        return None


def _layer_plan(config, fields: set[str], overrides: dict, special: dict) -> dict:
    """Depth and per-layer lists of a shrunk config: one layer per distinct kind of the default's layers.

    A default of 26 layers ``[sliding, sliding, ..., full, ...]`` keeps its first sliding and its first
    full layer (two layers, both kinds tested); lists of layer indices are renumbered to match.
    """
    depth_name = next((d for d in _DEPTH if d in fields and isinstance(_get(config, d), int)), None)
    if depth_name is None:
        return {}
    depth = _get(config, depth_name)
    per_layer = {
        n: list(v)
        for n in sorted(fields)
        if n not in _INDEX_LISTS
        and n not in special
        and isinstance(v := _get(config, n), (list, tuple))
        and len(v) == depth
    }
    if depth_name in special or not per_layer:
        keep = list(range(min(depth, overrides.get(depth_name, 2))))
    else:
        first: dict[tuple, int] = {}
        for i in range(depth):
            first.setdefault(tuple(repr(v[i]) for v in per_layer.values()), i)
        keep = sorted(first.values()) if len(first) > 1 else list(range(min(depth, 2)))
    plan = {depth_name: len(keep)}
    for name, values in per_layer.items():
        size = overrides.get(name)
        plan[name] = [size] * len(keep) if isinstance(size, int) else [values[i] for i in keep]
    for name in _INDEX_LISTS & fields:
        values = _get(config, name)
        if isinstance(values, (list, tuple)) and name not in special:
            plan[name] = [keep.index(i) for i in values if i in keep]
    return plan


def _special_token_ids(config) -> dict[str, int]:
    """Token-id attributes (``*_token_id``, ``*_token_index``) outside the tiny vocabulary, moved inside it."""
    moved, free = {}, iter(range(VOCAB - 1, 0, -1))
    for name in sorted(_fields(config)):
        if name.endswith("_token_id") or name.endswith("_token_index"):
            value = _get(config, name)
            if isinstance(value, int) and value >= VOCAB:
                moved[name] = next(free)
            elif isinstance(value, (list, tuple)) and any(isinstance(v, int) and v >= VOCAB for v in value):
                moved[name] = [next(free) for _ in value]
    return moved


def _shrunk(config, overrides: dict, special: dict):
    """A config of ``config``'s class with every size it has (and its sub-configs') replaced by ``overrides``."""
    fields = _fields(config)
    kwargs = {k: v for k, v in overrides.items() if k in fields}
    kwargs.update(_layer_plan(config, fields, overrides, special))
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = _get(config, name)
        if sub is not None and hasattr(sub, "to_dict"):
            kwargs[name] = _shrunk(sub, overrides, special)
    shrunk = type(config)(**kwargs)
    moved = _special_token_ids(shrunk)
    return type(config)(**{**kwargs, **moved}) if moved else shrunk


def tiny_config(model_type: str, *, overrides: dict | None = None, defaults: tuple[str, ...] = ()):
    """The config of ``model_type``, shrunk by ``GENERIC``, ``SPECIAL[model_type]`` and ``overrides``;
    the keys named in ``defaults`` (e.g. ``"use_cache"``) keep the value the config class gives them."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    special = {**SPECIAL.get(model_type, {}), **(overrides or {})}
    try:
        default = CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001 - a default that does not validate (gemma4_assistant): SPECIAL's sub-configs
        cls = CONFIG_MAPPING[model_type]
        default = cls(**{name: dict(special) for name in getattr(cls, "sub_configs", {}) or {}})
    sizes = {k: v for k, v in {**GENERIC, **special}.items() if k not in defaults}
    return _shrunk(default, sizes, special)


def _config_for(cls, config):
    """``config``, or its sub-config of the class ``cls`` is built from (a text model of a multimodal config)."""
    wanted = getattr(cls, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    for name in getattr(config, "sub_configs", {}) or {}:
        if isinstance(sub := _get(config, name), wanted):
            return sub
    return config


def build_tiny(
    model_type: str, class_name: str, *, seed: int = 0, overrides: dict | None = None, defaults: tuple[str, ...] = ()
):
    """A tiny float32 CPU model of ``class_name`` (random weights, seeded), in eval mode; ``overrides`` and
    ``defaults`` as in ``tiny_config``."""
    import torch
    import transformers

    cls = getattr(transformers, class_name)
    config = _config_for(cls, tiny_config(model_type, overrides=overrides, defaults=defaults))
    with torch.device("meta"):
        parameters = sum(p.numel() for p in cls(config).parameters())
    if parameters > MAX_PARAMETERS:
        raise ValueError(f"{parameters / 1e6:.1f}M parameters after the overrides (limit {MAX_PARAMETERS / 1e6:.0f}M)")
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32)
    return model.eval()


def _default_builds(model_type: str, class_name: str) -> bool:
    """Whether transformers builds ``class_name`` from its default config (on the meta device: no memory)."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        cls = getattr(transformers, class_name)
        with torch.device("meta"):
            cls(_config_for(cls, CONFIG_MAPPING[model_type]()))
        return True
    except Exception:  # noqa: BLE001
        return False


def random_examples(config, lengths=LENGTHS, *, seed: int = 0) -> list[dict]:
    """Examples of random token ids, avoiding every special token of the config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    special = set()
    for c in (config, text):
        for name in _fields(c):
            if name.endswith("_token_id") or name.endswith("_token_index"):
                value = _get(c, name)
                special.update(value if isinstance(value, (list, tuple)) else [value])
    vocab = int(getattr(text, "vocab_size", VOCAB) or VOCAB)
    allowed = np.array([t for t in range(min(vocab, VOCAB)) if t not in special], np.int64)
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.choice(allowed, size=n).tolist()} for n in lengths]


def loss_difference(model, examples: list[dict], collator) -> tuple[float, float, float]:
    """(packed loss, padded loss, |packed - padded| / |padded|) of one forward each, no gradients."""
    import torch

    with torch.no_grad():
        packed = float(model(**collator(examples)).loss)
        padded = float(model(**padded_batch(examples, multiple=1)).loss)
    return packed, padded, abs(packed - padded) / max(abs(padded), 1e-12)


def _short(error: BaseException, limit: int = 100) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:limit]


def check(model, batch: dict, collator) -> dict:
    """check_packing_support's verdict, and why: ``static: ...`` (no model run) or ``probe: ...`` (measured)."""
    from packing_collators import check_packing_support
    from packing_collators.checks import probe_packing

    try:
        check_packing_support(model, batch, collator=collator, probe=False)
    except ValueError as error:
        return {"verdict": "refused", "reason": "static: " + _short(error).removeprefix("ValueError: ")}
    try:
        check_packing_support(model, batch, collator=collator)
        return {"verdict": "accepted"}
    except ValueError as error:
        refused = {"verdict": "refused", "reason": "probe: " + _short(error).removeprefix("ValueError: ")}
    except Exception as error:  # noqa: BLE001 - the probe crashed: a bug of the probe, not a refusal
        return {"verdict": "error", "reason": "probe: " + _short(error)}
    try:  # the probe's numbers say more in a table than the start of its message
        report = probe_packing(model, collator)
    except Exception:  # noqa: BLE001
        return refused
    where = f" in {report.culprit}" if report.culprit else ""
    return {
        **refused,
        "reason": f"probe: leak {report.leak:.2g}{where}; packed vs alone {report.max_difference:.2g} "
        f"(tolerance {report.tolerance:.2g})",
    }


def _needs_preparing(model) -> bool:
    """Whether the model has layers that carry state or multimodal positions (what enable_packing prepares)."""
    from packing_collators.models import find_stateful_layers, multimodal_model

    return bool(find_stateful_layers(model)) or multimodal_model(model) is not None


def _attention_rows(model, examples: list[dict], row: dict, attentions) -> list[dict]:
    """One row per attention implementation of ``model`` as it is (prepared by enable_packing or not)."""
    from packing_collators import FlatteningCollator

    collator, rows = FlatteningCollator(), []
    for attention in attentions:
        started = time.perf_counter()
        out = {**row, "attention": attention, "loss_difference": None, "reason": ""}
        try:
            model.set_attn_implementation(attention)
        except Exception as error:  # noqa: BLE001
            rows.append({**out, "verdict": "not supported", "reason": _short(error), "seconds": 0.0})
            continue
        try:
            out["packed_loss"], out["padded_loss"], out["loss_difference"] = loss_difference(model, examples, collator)
        except Exception as error:  # noqa: BLE001
            out.update(verdict="error", reason="forward: " + _short(error))
        if out.get("verdict") != "error":
            out.update(check(model, collator(examples), collator))
        out["accepted_and_wrong"] = out["verdict"] == "accepted" and not out["loss_difference"] <= WRONG
        out["seconds"] = time.perf_counter() - started
        rows.append(out)
    return rows


def sweep_model(model_type: str, class_name: str, attentions=ATTENTIONS) -> list[dict]:
    """One row per attention implementation (or one "cannot build" row) for ``model_type``; a model with
    layers that carry state (hybrids) or multimodal positions gets its rows twice: as built, then after
    ``enable_packing`` (``prepared``)."""
    from packing_collators import enable_packing

    row = {"model_type": model_type, "class": class_name, "prepared": False}
    started = time.perf_counter()
    try:
        model = build_tiny(model_type, class_name)
        examples = random_examples(model.config)
    except Exception as error:  # noqa: BLE001 - every failure is a row
        default = "" if _default_builds(model_type, class_name) else " (its default config fails too)"
        return [
            {
                **row,
                "attention": "-",
                "verdict": "cannot build",
                "loss_difference": None,
                "reason": "cannot build tiny: " + _short(error) + default,
                "seconds": time.perf_counter() - started,
            }
        ]
    rows = _attention_rows(model, examples, row, attentions)
    if _needs_preparing(model):
        prepared = enable_packing(build_tiny(model_type, class_name))
        rows += _attention_rows(prepared, examples, {**row, "prepared": True}, attentions)
    return rows


def causal_lm_classes(only: list[str] | None = None) -> list[tuple[str, str]]:
    """(model_type, class name) of every causal LM of the installed transformers, or of ``only``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    pairs = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())
    if only:
        unknown = sorted(set(only) - {t for t, _ in pairs})
        if unknown:
            raise SystemExit(f"not causal-LM model types of this transformers: {', '.join(unknown)}")
        pairs = [(t, c) for t, c in pairs if t in only]
    return pairs


def summarise(rows: list[dict]) -> dict:
    """Rows per verdict, accepted-and-wrong rows (must be 0) and refusals with a tiny loss difference."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    false_refusals = [
        r
        for r in rows
        if r["verdict"] == "refused" and r["loss_difference"] is not None and r["loss_difference"] <= WRONG
    ]
    return {
        "verdicts": counts,
        "accepted_and_wrong": sum(r.get("accepted_and_wrong", False) for r in rows),
        "refused_with_loss_difference_under_1e-5": len(false_refusals),
        "rows": len(rows),
    }


def markdown(rows: list[dict], summary: dict, header: dict) -> str:
    counts = ", ".join(f"{summary['verdicts'].get(v, 0)} {v}" for v in VERDICTS)
    lines = [
        f"## check_packing_support on every causal LM of transformers {header['transformers']} (tiny models, CPU)",
        "",
        f"Machine: {header['machine']}, torch {header['torch']}, transformers {header['transformers']}; "
        f"{header['seconds']:.0f} s. Command: `{header['command']}`",
        "",
        f"**{summary['rows']} rows: {counts}. Accepted and wrong (accepted with loss difference > {WRONG:g}): "
        f"{summary['accepted_and_wrong']}** (must be 0). Refused with loss difference <= {WRONG:g}: "
        f"{summary['refused_with_loss_difference_under_1e-5']}.",
        "",
        f"Loss difference: |packed - padded| / |padded| of the loss on examples of {', '.join(map(str, LENGTHS))} "
        "random tokens, FlatteningCollator vs right padding with an attention_mask. Tiny float32 models "
        "(2 layers or one per layer kind, hidden 32, vocab 128, sliding windows of 4 tokens); flex_attention "
        + ("compiled." if header["compile_flex"] else "uncompiled (the same block masks, computed unfused)."),
        "",
        "A model with layers that carry state along the sequence (hybrids) or multimodal positions has its",
        "rows twice: as built (`prepared` no: refused, or wrong if accepted) and after `enable_packing(model)`.",
        "",
        "| model_type | class | prepared | attention | verdict | loss difference | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = "" if r["loss_difference"] is None else f"{r['loss_difference']:.2e}"
        verdict = "**accepted and WRONG**" if r.get("accepted_and_wrong") else r["verdict"]
        reason = r["reason"].replace("|", "\\|")
        prepared = "yes" if r.get("prepared") else "no"
        lines.append(
            f"| {r['model_type']} | {r['class']} | {prepared} | {r['attention']} | {verdict} | {diff} | {reason} |"
        )
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def uncompiled_flex():
    """transformers' flex_attention path run without torch.compile (the same masks, computed unfused)."""
    from torch.nn.attention import flex_attention as torch_flex
    from transformers import masking_utils
    from transformers.integrations import flex_attention as hf_flex

    def uncompiled(query, key, value, training=False, **kwargs):
        return torch_flex.flex_attention(query, key, value, **kwargs)

    def block_mask(*args, _compile=False, **kwargs):
        return torch_flex.create_block_mask(*args, _compile=False, **kwargs)

    saved = hf_flex.compile_friendly_flex_attention, masking_utils.create_block_mask
    hf_flex.compile_friendly_flex_attention, masking_utils.create_block_mask = uncompiled, block_mask
    try:
        yield
    finally:
        hf_flex.compile_friendly_flex_attention, masking_utils.create_block_mask = saved


@contextlib.contextmanager
def quiet():
    """transformers' per-model warnings and stray prints off (the table says what went wrong)."""
    from transformers.utils import logging as hf_logging

    level, torch_logger = hf_logging.get_verbosity(), logging.getLogger("torch")
    torch_level = torch_logger.level
    hf_logging.set_verbosity_error()
    torch_logger.setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            hf_logging.set_verbosity(level)
            torch_logger.setLevel(torch_level)
