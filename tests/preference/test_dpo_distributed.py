"""PackingDPOTrainer on 2 gloo ranks (DDP) logs what TRL's DPOTrainer logs on the same 2 ranks.

Each rank packs its own micro-batch of pairs into one row; the loss, the rewards and the
log-probabilities TRL gathers over ranks must agree, step by step.
"""

from __future__ import annotations

import json

import pytest
from _two_ranks import run_two_ranks

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

trl = pytest.importorskip("trl")
if tuple(int(x) for x in trl.__version__.split(".")[:2]) < (1, 16):
    pytest.skip("PackingDPOTrainer builds on TRL >= 1.16's DPOTrainer", allow_module_level=True)

WORKER = r"""
import copy, json, sys
sys.path.insert(0, {tests!r})
sys.path.insert(0, {tests!r} + "/preference")
import datasets, torch
from trl import DPOConfig, DPOTrainer
from _pairs import text_pairs, word_tokenizer
from _tiny_models import tiny_model
from packing_collators import PackingDPOTrainer

out = sys.argv[1]
logs = {{}}
for name, cls in (("trl", DPOTrainer), ("packed", PackingDPOTrainer)):
    model = tiny_model("llama", vocab_size=64, initializer_range=0.05)
    args = DPOConfig(output_dir=out + "/" + name, max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3,
                     logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                     max_length=64, bf16=False, lr_scheduler_type="constant")
    trainer = cls(model=model, ref_model=copy.deepcopy(model).eval(), args=args,
                  train_dataset=datasets.Dataset.from_list(text_pairs(16, seed=2)), processing_class=word_tokenizer())
    trainer.train()
    logs[name] = [e for e in trainer.state.log_history if "rewards/margins" in e]
logs["world"] = args.world_size
if args.process_index == 0:
    open(out + "/logs.json", "w").write(json.dumps(logs))
"""


def test_two_ranks_log_what_trl_logs_on_two_ranks(tmp_path):
    run_two_ranks(WORKER, tmp_path)
    logs = json.loads((tmp_path / "logs.json").read_text())
    assert logs["world"] == 2
    assert len(logs["trl"]) == len(logs["packed"]) == 2
    for ours, theirs in zip(logs["packed"], logs["trl"]):
        for name in ("loss", "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected"):
            assert ours[name] == pytest.approx(theirs[name], rel=1e-4, abs=1e-6), name
