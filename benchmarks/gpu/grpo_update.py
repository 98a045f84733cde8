"""The update side of a GRPO step, TRL's GRPOTrainer against PackingGRPOTrainer on one GPU (issue #64): tokens/s, memory.

    python benchmarks/gpu/grpo_update.py --all --out DIR            # trl, packed, shared: each its own process
    python benchmarks/gpu/grpo_update.py --setting packed --out DIR # one run, this process
    python benchmarks/gpu/grpo_update.py --compare --out DIR        # DIR/results.json and DIR/README.md (no torch)
    python benchmarks/gpu/grpo_update.py --all --smoke --out DIR    # the CPU check, seconds

On the device (TRL 1.16 carried as a wheel: ``bash benchmarks/gpu/vs_trl_wheels.sh`` stages ``.trlwhl``)::

    pip install --no-index --no-deps --target /tmp/trl .trlwhl/*.whl && export PYTHONPATH=/tmp/trl:$PYTHONPATH &&
    python3 benchmarks/gpu/grpo_update.py --all --out /tmp/grpo && python3 benchmarks/gpu/grpo_update.py --compare --out /tmp/grpo

What is timed: one optimizer step per prompt group, from the completions TRL would hand its loss (generation is
TRL's own on both sides and is not part of this): ``trainer.compute_loss(model, inputs)`` (the policy's per-token
log-probabilities and TRL's loss), the backward, the optimizer's step, between two synchronizations. The same
groups in every setting (seeded): G = 8 completions of one prompt per step (TRL's micro-batch of
``per_device_train_batch_size = G``), prompts lognormal around 1,000 tokens clipped to [64, 4096] (``--prompts``), completions
lognormal around 512 clipped to [16, 2048]; ``advantages`` standard normal; ``beta = 0`` and ``loss_type`` TRL's
default (``dapo``), so the policy's forward is the only one (TRL's defaults: no reference model). ``--trainer rloo``
times RLOOTrainer against PackingRLOOTrainer the same way (beta 0 there too: RLOO's default 0.05 would load a
reference model by name; its ``old_logps`` per sequence, the policy's own before the step, as TRL's generation
computes them: ``old_logps``), runs named ``rloo_*``.

    trl     TRL 1.16 GRPOTrainer: prompts padded left, completions right, its fused LM head; attention "sdpa"
            (``--trl-attn``; what a GPU without flash-attn packages gives a TRL user)
    packed  PackingGRPOTrainer: each micro-batch one row of its real tokens; attention ``--attn``
            (default packing_varlen: torch's varlen flash kernel, no extra package)
    shared  PackingGRPOTrainer(share_prompt=True): each prompt once for its 8 completions

Model (``--model``): ``qwen3``, Qwen3-1.7B's shape (hidden 2048, 28 layers, 16 query / 8 kv heads of 128, MLP 6144,
vocabulary 151,936, tied embeddings); ``qwen3_5``, the hybrid Qwen3.5-0.8B text model of ``_hybrid_models.py`` (18 Gated
DeltaNet and 6 attention layers, fla's kernels where installed, on both sides). Seeded random weights in bf16
(``--weights float32``: float32 weights under bf16 autocast on both sides, what TRL's configs train by default:
the model prepared by accelerate as ``Trainer.train()`` prepares it, so its forward runs under the autocast; each
JSON's ``forward_autocast`` says what the layers ran under),
gradient checkpointing (non-reentrant) on every side, AdamW (the Trainer's default, lr 1e-6). ``--smoke``: 2 to 4
layers of hidden 64 and vocabulary 512, on the CPU. Attention: ``--attn`` ours (``packing_fa4`` for FA4: the same
kernel as one op; share_prompt needs it), ``--trl-attn`` TRL's (``flash_attention_4``, through ``fa4_int_lengths``).

``--generate N`` also times TRL's generation (``_generate_and_score_completions``, the same code on every side) for
the first N groups' prompts, G completions of exactly ``--generate-tokens`` each; ``--compare`` then adds the whole
step (median generation + median update, ``whole_step_vs_trl``: TRL's step time over ours).
``--profile-step K`` profiles step K (warm-ups counted from 0) with torch.profiler: ``RUN_profile.txt`` holds its
tables, the JSON its kernels' summed device time and launches (``profile``), to set against the step's wall time.
The profiled step counts with the warm-ups: the profiler's own cost stays out of the medians.
``--same-group`` runs the first group's lengths at every step, so kernels that compile per shape (fla's, tilelang's)
compile once and a fresh machine's profile is not of compiles.
Per setting (JSON): the median step's real tokens/s (sum over the group of prompt + completion), the peak
allocated memory, each step's loss and gradient norm; ``--compare`` writes ``update_tokens_per_s_vs_trl`` and
``peak_memory_vs_trl`` per row, and the largest relative gradient-norm difference to TRL over the steps (the loss
itself is the same number on both sides at a first step, whatever the log-probabilities: the ratio is 1; in bf16
this is agreement, not exactness, which tests/rl checks in float32).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SETTINGS = ("trl", "packed", "shared")
MODELS = ("qwen3", "qwen3_5")
HERE = Path(__file__).resolve()


def arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=SETTINGS)
    parser.add_argument("--all", action="store_true", help="every setting, each in a process of its own")
    parser.add_argument("--compare", action="store_true", help="the table of the runs in --out")
    parser.add_argument("--out", required=True)
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (G), one micro-batch")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--attn", default="packing_varlen", help="the packed settings' attention")
    parser.add_argument("--trl-attn", default="sdpa", help="TRL's attention")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trainer", choices=("grpo", "rloo"), default="grpo",
                        help="TRL's GRPOTrainer / RLOOTrainer against PackingGRPOTrainer / PackingRLOOTrainer")
    parser.add_argument("--model", choices=MODELS, default="qwen3", help="qwen3: Qwen3-1.7B's shape; qwen3_5: a hybrid")
    parser.add_argument("--generate", type=int, default=0,
                        help="after the update steps, time this many groups' generation (TRL's own on every side)")
    parser.add_argument("--generate-tokens", type=int, default=512, help="tokens each generated completion has")
    parser.add_argument("--setting-timeout", type=float, default=None,
                        help="with --all: seconds each setting's process may run (its finished steps are kept)")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="with --all: which settings, in this order")
    parser.add_argument("--prompts", default="64,1000,4096",
                        help="prompt lengths: shortest, median, longest (lognormal around the median, clipped)")
    parser.add_argument("--same-group", action="store_true",
                        help="every step the first group's lengths (kernels that compile per shape compile once)")
    parser.add_argument("--weights", choices=("bf16", "float32"), default="bf16",
                        help="the model's weights on the GPU: bf16, or float32 under bf16 autocast (TRL's defaults)")
    parser.add_argument("--profile-step", type=int, default=None,
                        help="profile this step (0-based, warm-ups counted): RUN_profile.txt, the kernels' time in JSON")
    args = parser.parse_args(argv)
    if args.profile_step is not None and not 0 <= args.profile_step < args.warmup + args.steps:
        parser.error(f"--profile-step {args.profile_step}: the run has steps 0 to {args.warmup + args.steps - 1} "
                     f"({args.warmup} warm-ups, then {args.steps}); pass one of those")  # fmt: skip
    return args


def group_lengths(args, count: int) -> list[tuple[int, list[int]]]:
    """(prompt length, completion lengths) of each step's group, seeded: the same in every setting."""
    rng = np.random.default_rng([args.seed, 64])
    scale = 16 if args.smoke else 1
    shortest, median, longest = (int(n) for n in args.prompts.split(","))
    groups = []
    for _ in range(count):
        prompt = int(np.clip(rng.lognormal(np.log(median) - 0.18, 0.6), shortest, longest)) // scale
        completions = np.clip(rng.lognormal(np.log(512) - 0.32, 0.8, args.group), 16, 2048).astype(int) // scale
        groups.append((max(prompt, 2), [max(int(c), 1) for c in completions]))
    return groups


def step_groups(args) -> list[tuple[int, list[int]]]:
    """Each step's group (warm-ups first): :func:`group_lengths`, or its first group every step (``--same-group``)."""
    groups = group_lengths(args, args.warmup + args.steps)
    return groups[:1] * len(groups) if args.same_group else groups


def group_inputs(prompt: int, completions: list[int], vocab: int, seed: int, device) -> dict:
    """TRL's inputs to its loss for one group: one prompt (G times), completions padded right, advantages."""
    import torch

    g = torch.Generator().manual_seed(seed)
    longest = max(completions)
    prompt_ids = torch.randint(2, vocab, (1, prompt), generator=g).repeat(len(completions), 1)
    completion_ids = torch.randint(2, vocab, (len(completions), longest), generator=g)
    completion_mask = (torch.arange(longest)[None] < torch.tensor(completions)[:, None]).long()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, 0)
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
        "completion_mask": completion_mask, "advantages": torch.randn(len(completions), generator=g),
        "old_per_token_logps": None, "num_items_in_batch": completion_mask.sum(),
    }  # fmt: skip
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}


def build_model(args, device):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if args.model == "qwen3_5":  # Qwen3.5-0.8B's text model (hybrid_throughput.py's), its checkpoint's use_cache on
        from _hybrid_models import qwen3_5_config

        config = qwen3_5_config(args.smoke)
        config.use_cache, config.pad_token_id, config.eos_token_id = True, 0, 1
        torch.manual_seed(args.seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
        return model.to(weight_dtype(args))
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512) if args.smoke else dict(
                 hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936)  # fmt: skip
    config = Qwen3Config(**shape, tie_word_embeddings=True, max_position_embeddings=8192, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(weight_dtype(args))


def weight_dtype(args):
    """The weights' dtype: float32 on the CPU (smoke) and under ``--weights float32`` (TRL's defaults: its configs'
    ``bf16=True`` then trains float32 weights under bf16 autocast, on both sides), else bf16.

    >>> weight_dtype(arguments(["--out", "x"])), weight_dtype(arguments(["--out", "x", "--weights", "float32"]))
    (torch.bfloat16, torch.float32)
    """
    import torch

    return torch.float32 if args.smoke or args.weights == "float32" else torch.bfloat16


def run_one(args, save=None) -> dict:
    import datasets
    import torch
    from _dpo_data import word_tokenizer
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    sys.path.insert(0, str(HERE.parents[2]))
    from _vs_trl_measure import fa4_int_lengths

    from packing_collators import PackingGRPOTrainer, PackingRLOOTrainer, choose_attention
    from packing_collators._compat import enable_activation_checkpointing

    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    fa4 = fa4_int_lengths() if cuda else {"installed": False}  # transformers' FA4 hands it tensor lengths: see there
    model = build_model(args, device)
    attention = args.trl_attn if args.setting == "trl" else args.attn
    if not cuda and attention in ("packing_varlen", "packing_fa4"):  # their kernels need CUDA: smoke packs under sdpa
        attention = "sdpa"
    choose_attention(model, attention)  # packing_varlen / packing_fa4 registered first
    enable_activation_checkpointing(model, {"use_reentrant": False})
    rloo = args.trainer == "rloo"
    autocast = args.weights == "float32"  # TRL's defaults: bf16=True over float32 weights (on the CPU too, --smoke)
    config = (RLOOConfig if rloo else GRPOConfig)(output_dir=str(Path(args.out) / "trainer"), per_device_train_batch_size=args.group,
                        num_generations=args.group, max_completion_length=2048, bf16=cuda or autocast, use_cpu=not cuda,
                        learning_rate=1e-6, beta=0.0, report_to="none", save_strategy="no", disable_tqdm=True)  # fmt: skip
    prompts = datasets.Dataset.from_list([{"prompt": "w1 w2"}] * args.group)
    common = dict(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
                  train_dataset=prompts, processing_class=word_tokenizer(model.config.vocab_size))  # fmt: skip
    if args.setting == "trl":
        trainer = (RLOOTrainer if rloo else GRPOTrainer)(**common)
    else:
        packing = PackingRLOOTrainer if rloo else PackingGRPOTrainer
        trainer = packing(**common, share_prompt=args.setting == "shared", packing_probe=False)
    if autocast:  # what Trainer.train() does first: accelerate wraps the model's forward in its bf16 autocast
        model = trainer.accelerator.prepare_model(model)
    forwards = forward_autocast(model, device.type)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # what the Trainer's loop sets: one micro-batch per step
    model.train()
    groups = step_groups(args)
    steps, losses = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for index, (prompt, completions) in enumerate(groups):
        inputs = group_inputs(prompt, completions, model.config.vocab_size, args.seed + index, device)
        if rloo:
            inputs["old_logps"] = old_logps(trainer, model, inputs, args.group)
        if cuda:
            torch.cuda.synchronize()
        profiler = step_profiler(cuda) if index == args.profile_step else contextlib.nullcontext()
        started = time.perf_counter()
        with profiler, GcPauses() as pauses:
            loss = trainer.compute_loss(model, inputs)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        tokens = sum(prompt + c for c in completions)
        padded = len(completions) * (prompt + max(completions))
        steps.append({"seconds": seconds, "prompt": prompt, "tokens": tokens, "padded_positions": padded,
                      "warmup": index < args.warmup or index == args.profile_step})  # profiled: not timed
        losses.append(float(loss.detach()))
        steps[-1]["grad_norm"] = grad_norm
        steps[-1]["gc"] = pauses.found  # Python's collections inside the step: a host-paced step waits for them
        if index == args.profile_step:
            steps[-1]["profile"] = write_profile(profiler, Path(args.out) / f"{run_name(args.model, args.setting, args.trainer)}_profile.txt")
        if save is not None:  # what a step finished is kept if the call's time runs out (warm-ups too: a cold start's cost)
            save({**summary(args, model, attention, fa4, steps, losses, None, cuda), "partial": True,
                  "forward_autocast": sorted(forwards)})
    generation = time_generation(args, trainer, groups[: args.generate], cuda) if args.generate else None
    return {**summary(args, model, attention, fa4, steps, losses, generation, cuda), "forward_autocast": sorted(forwards)}


def forward_autocast(model, device_type: str) -> set:
    """The autocast dtypes the model's layers ran under ("none" without), filled as the model runs: a float32 row whose
    set says "none" ran float32 throughout, not TRL's defaults."""
    import torch

    seen: set = set()

    def record(module, _):
        on = torch.is_autocast_enabled(device_type)
        seen.add(str(torch.get_autocast_dtype(device_type)) if on else "none")

    model.get_input_embeddings().register_forward_pre_hook(record)  # inside forward, where accelerate's autocast is on
    return seen


class GcPauses:
    """Python's garbage collections while the block runs: ``found`` maps each generation that ran ("gen0" to
    "gen2") to [collections, milliseconds]. A GPU-bound step hides them behind the queued kernels; a host-paced one
    (the hybrid's shared step) waits for them, and a full collection over a loaded model's objects takes tens of ms.

    >>> import gc
    >>> with GcPauses() as pauses:
    ...     _ = gc.collect()
    >>> pauses.found["gen2"][0]
    1
    """

    def __init__(self) -> None:
        self.found: dict[str, list] = {}
        self._started = 0.0

    def _record(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        count, ms = self.found.setdefault(f"gen{info['generation']}", [0, 0.0])
        self.found[f"gen{info['generation']}"] = [count + 1, ms + (time.perf_counter() - self._started) * 1e3]

    def __enter__(self) -> GcPauses:
        import gc

        gc.callbacks.append(self._record)
        return self

    def __exit__(self, *exc) -> None:
        import gc

        gc.callbacks.remove(self._record)


def old_logps(trainer, model, inputs: dict, group: int):
    """RLOO's old-policy log-probability of each sequence, as TRL's generation computes it (num_iterations 1: the
    policy itself, no gradient, the trainer's own forward; untimed). Its ratio is then 1 at the step, as in training:
    a guessed one would sit far off 1 over a sequence's hundreds of tokens, clipped (no gradient) or exp of a sum of
    bf16 roundings, and no side's gradient would say anything about the other's."""
    import torch

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    kept = inputs["completion_ids"].size(1)
    with torch.no_grad():
        per_token, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, kept, group)
    return (per_token * inputs["completion_mask"]).sum(1)


def step_profiler(cuda: bool):
    """torch.profiler over one step: the host's ops and, on a GPU, the kernels."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))


def write_profile(profiler, path: Path) -> dict:
    """The profiled step's tables (by device time, by host self time) to ``path``; what its JSON keeps: the kernels'
    summed device time and launches (a step whose wall time is far above its kernels' waits on the host)."""
    events = profiler.key_averages()
    device = [e for e in events if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA")]
    kernels_us = sum(e.self_device_time_total for e in device)
    launches = sum(e.count for e in device)
    by_device = events.table(sort_by="self_device_time_total", row_limit=45) if device else ""
    path.write_text(by_device + "\n\n" + events.table(sort_by="self_cpu_time_total", row_limit=45))
    return {"kernels_ms": kernels_us / 1e3, "kernel_launches": launches, "tables": path.name}


def summary(args, model, attention, fa4, steps, losses, generation, cuda) -> dict:
    """The run's JSON: its steps so far, the median of the timed ones, the kernels its layers ran."""
    import torch
    import transformers
    import trl

    from packing_collators.models import packing_layers

    timed = [s for s in steps if not s["warmup"]]
    paths = sorted(set(packing_layers(model).paths.values())) if args.setting != "trl" else None  # which kernels ran
    return {
        "setting": args.setting, "trainer": args.trainer, "model": args.model, "weights": str(weight_dtype(args)), "attention": attention, "fa4_int_lengths": fa4, "layer_paths": paths,
        "linear_attention_kernels": linear_attention_kernels(model),
        "generation": generation, "median_update_seconds": statistics.median(s["seconds"] for s in timed) if timed else None,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "prompts": args.prompts, "steps": steps, "losses": losses,
        "median_tokens_per_s": statistics.median(s["tokens"] / s["seconds"] for s in timed) if timed else None, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }  # fmt: skip


def linear_attention_kernels(model) -> dict:
    """Which implementation transformers' own linear-attention functions resolved to (fla's, or the torch reference
    it falls back to): TRL's side runs them as they are, so its figure is fla's only where these name fla."""
    import inspect

    module = inspect.getmodule(type(model))
    found = {}
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update"):
        fn = getattr(module, name, None)
        if fn is None:
            continue
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ())) if hasattr(fn, "__code__") else {}
        chosen = cells["implementation"].cell_contents if "implementation" in cells else fn
        found[name] = f"{getattr(chosen, '__module__', '?')}.{getattr(chosen, '__name__', '?')}"
    return found


def time_generation(args, trainer, groups, cuda: bool) -> dict:
    """TRL's ``_generate_and_score_completions`` on each group's prompt (the same code on every side: generation is
    TRL's): G completions of exactly ``--generate-tokens`` (eos held off, so every side generates the same count).
    Under the trainer's decoding attention (ours switches a packed-only one to the transformers kernel that decodes);
    where that fails, under sdpa. The JSON names the attention the first decoding forward ran under."""
    import torch

    vocab = trainer.model.config.get_text_config().vocab_size
    trainer.generation_config.max_new_tokens = trainer.generation_config.min_new_tokens = args.generate_tokens
    error, seconds, decoded = None, [], []
    hook = trainer.model.register_forward_pre_hook(lambda module, _: decoded.append(module.config._attn_implementation))
    for index, (prompt, _) in enumerate(groups):
        text = " ".join(f"w{(index * 7919 + i) % (vocab - 2)}" for i in range(prompt))
        batch = [{"prompt": text}] * args.group
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        try:
            trainer._generate_and_score_completions(batch)
        except Exception as failure:  # noqa: BLE001 - recorded: the row says which attention generated
            if error is not None:
                raise
            error = f"{type(failure).__name__}: {failure}"[:600]
            trainer.model.set_attn_implementation("sdpa")
            decoded.clear()
            trainer._generate_and_score_completions(batch)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    hook.remove()
    return {"seconds": seconds, "median_seconds": statistics.median(seconds), "attention": decoded[0],
            "error": error, "completion_tokens": args.generate_tokens, "prompts": [p for p, _ in groups]}  # fmt: skip


def run_name(model: str, setting: str, trainer: str = "grpo") -> str:
    return f"{model}_{setting}" if trainer == "grpo" else f"{trainer}_{model}_{setting}"


def compare(out: Path) -> list[dict]:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "results"}
    rows = []
    for trainer in ("grpo", "rloo"):
        for model in MODELS:
            trl = runs.get(run_name(model, "trl", trainer))
            for name in ("packed", "shared"):
                run = runs.get(run_name(model, name, trainer))
                if run is None or trl is None or not (_finished(run) and _finished(trl)):
                    continue
                rows.append({"trainer": trainer, **compare_row(model, name, run, trl)})
    (out / "results.json").write_text(json.dumps({"rows": rows, "runs": runs}, indent=1))
    lines = ["| trainer | model | setting | prompts (shortest, median, longest) | attention (ours / TRL) | weights | update tokens/s | TRL | x TRL | "
             "steady x TRL (steps; TRL stalls) | peak GiB | TRL GiB | memory x TRL | grad_norm rel diff | whole step s (TRL) | whole step x TRL |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        memory = f"{r['peak_memory_vs_trl']:.3f}" if r["peak_memory_vs_trl"] else "-"
        peaks = [f"{v:.1f}" if v else "-" for v in (r["peak_gib"], r["trl_peak_gib"])]
        whole = (f"{r['whole_step_s']:.2f} ({r['trl_whole_step_s']:.2f}) | {r['whole_step_vs_trl']:.3f}"
                 if r["whole_step_vs_trl"] else "- | -")  # fmt: skip
        lines.append(f"| {r['trainer']} | {r['model']} | {r['setting']} | {r['prompts']} | {r['attention']} / {r['trl_attention']} | "
                     f"{_weights(r)} | {r['update_tokens_per_s']:,.0f} | {r['trl_update_tokens_per_s']:,.0f} | {r['update_tokens_per_s_vs_trl']:.3f} | "
                     f"{_steady(r)} | "
                     f"{peaks[0]} | {peaks[1]} | {memory} | {r['grad_norm_max_rel_diff_vs_trl']:.2e} | {whole} |")  # fmt: skip
    lines += [_unfinished(name, run) for name, run in runs.items() if not _finished(run)]
    print("\n".join(lines))
    return rows


def _finished(run: dict) -> bool:
    """Whether a setting's run timed a step (not failed, not stopped by its time limit before its warm-up ended)."""
    return "error" not in run and run.get("median_tokens_per_s") is not None


def _unfinished(name: str, run: dict) -> str:
    """A run with no timed step, in words: its failure, or the warm-up steps it finished before it was stopped.

    >>> _unfinished("qwen3_5_trl", {"steps": [{"seconds": 41.5, "tokens": 9000}], "partial": True})
    'qwen3_5_trl: no timed step; stopped after 1 warm-up step (41.5 s for 9,000 tokens)'
    >>> _unfinished("qwen3_5_trl", {"steps": [], "partial": True})
    'qwen3_5_trl: no timed step; stopped before its first step ended'
    """
    if "error" in run:
        return f"{name}: failed: {run['error'].strip().splitlines()[-1] if run['error'].strip() else '?'}"
    done = run.get("steps", [])
    if not done:
        return f"{name}: no timed step; stopped before its first step ended"
    each = ", ".join(f"{s['seconds']:.1f} s for {s['tokens']:,} tokens" for s in done)
    return f"{name}: no timed step; stopped after {len(done)} warm-up step{'s' if len(done) > 1 else ''} ({each})"


def _weights(row: dict) -> str:
    """The weights' dtype of both sides, one word where they agree (they do in every run of this harness), and the
    autocast their layers ran under where a run recorded one (runs before ``forward_autocast`` did not).

    >>> _weights({"weights": "torch.float32", "trl_weights": "torch.float32"})
    'float32'
    >>> both = ["torch.bfloat16"]
    >>> _weights({"weights": "torch.float32", "trl_weights": "torch.float32", "forward_autocast": both, "trl_forward_autocast": both})
    'float32 (autocast bfloat16)'
    >>> _weights({"weights": "torch.float32", "trl_weights": "torch.float32", "forward_autocast": ["none"], "trl_forward_autocast": ["none"]})
    'float32 (no autocast)'
    """
    ours, theirs = (row[k].removeprefix("torch.") for k in ("weights", "trl_weights"))
    words = ours if ours == theirs else f"{ours} / {theirs}"
    casts = {", ".join(c.removeprefix("torch.") for c in row[k]) for k in ("forward_autocast", "trl_forward_autocast") if row.get(k)}
    if not casts or ours != "float32":
        return words
    cast = casts.pop() if len(casts) == 1 else "differs"
    return f"{words} ({'no autocast' if cast == 'none' else 'autocast ' + cast})"


def _steady(row: dict) -> str:
    value = row.get("steady_update_vs_trl")
    return f"{value:.3f} ({row['steady_steps']}; {row['trl_stalled_steps']})" if value else "-"


def compare_row(model: str, name: str, run: dict, trl: dict) -> dict:
    """One setting against TRL's run of the same model: the update's ratios, and the whole step where generation ran
    (a step = the median generation + the median update; the speed-up is TRL's step time over ours)."""
    norms = [(a["grad_norm"], b["grad_norm"]) for a, b in zip(run["steps"], trl["steps"])]
    whole = trl_whole = None
    if run.get("generation") and trl.get("generation"):
        whole = run["generation"]["median_seconds"] + run["median_update_seconds"]
        trl_whole = trl["generation"]["median_seconds"] + trl["median_update_seconds"]
    steady = steady_ratio(run["steps"], trl["steps"])
    return {
        "model": model, "setting": name, "prompts": run.get("prompts"), "device": run["device"],
        **steady,
        "attention": run["attention"], "trl_attention": trl["attention"],
        "weights": run.get("weights", "torch.bfloat16"), "trl_weights": trl.get("weights", "torch.bfloat16"),
        "forward_autocast": run.get("forward_autocast"), "trl_forward_autocast": trl.get("forward_autocast"),
        "update_tokens_per_s": run["median_tokens_per_s"], "trl_update_tokens_per_s": trl["median_tokens_per_s"],
        "update_tokens_per_s_vs_trl": run["median_tokens_per_s"] / trl["median_tokens_per_s"],
        "peak_gib": run["peak_gib"], "trl_peak_gib": trl["peak_gib"],
        "peak_memory_vs_trl": run["peak_gib"] / trl["peak_gib"] if run["peak_gib"] and trl["peak_gib"] else None,
        "grad_norm_max_rel_diff_vs_trl": max(abs(a - b) / max(abs(b), 1e-12) for a, b in norms),
        "whole_step_s": whole, "trl_whole_step_s": trl_whole,
        "whole_step_vs_trl": trl_whole / whole if whole else None,
    }  # fmt: skip


STALL = 5.0  # a step this many times slower than its tokens take at the run's fastest rate: a compile, not work


def stalled(steps: list[dict]) -> list[bool]:
    """Which timed steps stalled: a kernel compiled at a new shape (Triton's, tilelang's: seconds) inside the step.

    >>> stalled([{"tokens": 100, "seconds": 1.0}, {"tokens": 200, "seconds": 2.5}, {"tokens": 100, "seconds": 9.0}])
    [False, False, True]
    """
    fastest = max(s["tokens"] / s["seconds"] for s in steps)
    return [s["seconds"] > STALL * s["tokens"] / fastest for s in steps]


def steady_ratio(ours: list[dict], trl: list[dict]) -> dict:
    """TRL's step time over ours, step by step on the same groups, over the timed steps where neither side stalled;
    their median is ``steady_update_vs_trl`` (the median tokens/s ratio counts every stall where it falls)."""
    ours, trl = [s for s in ours if not s["warmup"]], [s for s in trl if not s["warmup"]]
    n = min(len(ours), len(trl))  # a run stopped by its time limit has fewer
    ours, trl = ours[:n], trl[:n]
    assert [s["tokens"] for s in ours] == [s["tokens"] for s in trl], "the same groups on both sides"
    if not n:
        return {"steady_update_vs_trl": None, "steady_steps": 0, "stalled_steps": 0, "trl_stalled_steps": 0,
                "per_step_update_vs_trl": []}  # fmt: skip
    calm = [not (a or b) for a, b in zip(stalled(ours), stalled(trl))]
    ratios = [b["seconds"] / a["seconds"] for a, b, keep in zip(ours, trl, calm) if keep]
    return {"steady_update_vs_trl": statistics.median(ratios) if ratios else None, "steady_steps": len(ratios),
            "stalled_steps": len(calm) - len(ratios), "trl_stalled_steps": sum(stalled(trl)),
            "per_step_update_vs_trl": [b["seconds"] / a["seconds"] for a, b in zip(ours, trl)]}  # fmt: skip


def main() -> None:
    args = arguments()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.compare:
        compare(out)
        return
    if args.all:
        for setting in args.settings.split(","):
            command = [sys.executable, str(HERE), *[a for a in sys.argv[1:] if a != "--all"], "--setting", setting]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.setting_timeout)
            except subprocess.TimeoutExpired as expired:  # its steps so far are in its JSON ("partial")
                print(f"{setting}: stopped after {args.setting_timeout} s", (expired.stderr or b"")[-2000:], flush=True)
                path = out / f"{run_name(args.model, setting, args.trainer)}.json"
                run = json.loads(path.read_text()) if path.exists() else {"setting": setting, "model": args.model, "steps": []}
                path.write_text(json.dumps({**run, "partial": True, "stopped_after_s": args.setting_timeout}, indent=1))
                continue
            print(done.stdout[-2000:], done.stderr[-4000:] if done.returncode else "", flush=True)
            if done.returncode:  # the run's failure is a result: recorded, the driver goes on
                failed = {"setting": setting, "model": args.model, "error": done.stderr[-4000:]}
                (out / f"{run_name(args.model, setting, args.trainer)}.json").write_text(json.dumps(failed))
        return
    sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]  # benchmarks/gpu (_dpo_data), benchmarks (_lengths)
    path = out / f"{run_name(args.model, args.setting, args.trainer)}.json"
    result = run_one(args, save=lambda partial: path.write_text(json.dumps(partial, indent=1)))
    path.write_text(json.dumps(result, indent=1))
    print(f"{args.setting}: {result['median_tokens_per_s']:,.0f} tokens/s, peak {result['peak_gib']} GiB")


if __name__ == "__main__":
    main()
