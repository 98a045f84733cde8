"""vs_trl.py --recount: the real tokens of PackingTrainer runs whose steps counted a compile bucket's padding.

Compiled, PackingTrainer pads every micro-batch to its token budget (one bucket) with a segment of token 0 that is
never trained. Up to commit c2a4708 the harness counted that padding as tokens (every step 16,384) and its
segment as an example, so ours' rates were a little high (the epoch plan's padding: 0.67% of the slots). This
rebuilds each such run's micro-batches on the CPU: the run's own command line (dataset, budget, seed), a
PackingTrainer on a one-layer model of the same vocabulary whose train dataloader plans the same steps, its
collator before the bucket padding. Each step is checked against the recorded one (the token-id checksum, which the
padding's id 0 leaves unchanged, and the example count less the padding segment), then the step's tokens and
examples and the run's statistics are rewritten (``recounted`` says so). A step that does not match stops it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

_DONE = "real tokens recounted on the CPU (vs_trl.py --recount): the bucket padding left out"


def _planned_steps(args, n: int) -> list[tuple[int, int, int]]:
    """(tokens, examples, checksum) of the first ``n`` micro-batches PackingTrainer plans for ``args``' run."""
    import _vs_trl_settings as settings
    import torch
    from _vs_trl_measure import batch_numbers
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from packing_collators import PackingTrainer

    model = LlamaForCausalLM(LlamaConfig(vocab_size=args.vocab, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))  # fmt: skip
    dataset = settings.make_dataset(args, settings.examples_needed(args, args.setting))
    kwargs = {k: v for k, v in settings.training_kwargs(args, False, args.steps).items() if "compile" not in k}
    trainer = PackingTrainer(model=model, args=TrainingArguments(**kwargs, per_device_train_batch_size=1),
                             train_dataset=dataset, max_tokens_per_batch=args.budget, packing_probe=False,
                             compile_layers=False, attn_implementation=None)  # fmt: skip
    steps = []
    for batch in trainer.get_train_dataloader():
        numbers = batch_numbers(batch)
        steps.append(tuple(int(torch.as_tensor(numbers[k])) for k in ("tokens", "examples", "checksum")))
        if len(steps) == n:
            break
    return steps


def recount(folder: Path, parse_arguments) -> list[str]:
    """Recount every bucketed ``ours_packing`` run of ``folder`` in place; the names of those rewritten.
    ``parse_arguments``: vs_trl.py's parser (a run's recorded command -> its options), passed in so that this
    module does not import vs_trl.py, which imports it."""
    from _vs_trl_measure import step_statistics

    done = []
    for path in sorted(folder.glob("ours_packing*_gc_*.json")):
        run = json.loads(path.read_text())
        if run.get("recounted") or not run.get("compile"):  # counted right, or never padded to a bucket
            continue
        args = parse_arguments(shlex.split(run["command"])[2:])
        recorded = run["steps"]
        old_tokens = sum(s["tokens"] for s in recorded)
        for step, (tokens, examples, checksum) in zip(recorded, _planned_steps(args, len(recorded))):
            padded = int(tokens < step["tokens"])
            if (checksum, examples + padded) != (step["checksum"], step["examples"]):
                raise SystemExit(f"{path.name}: step {step['step']} is not the planned micro-batch "
                                 f"(checksum {checksum} vs {step['checksum']}); left as it was")  # fmt: skip
            step["tokens"], step["examples"] = tokens, examples
        whole_seconds = old_tokens / run["statistics"]["whole_run_tokens_per_s"]  # the run's wall time, as recorded
        run["statistics"] = step_statistics(recorded, args.warmup, whole_seconds)
        run["recounted"] = _DONE
        path.write_text(json.dumps(run, indent=1) + "\n")
        done.append(path.name)
    return done
