"""A hybrid loaded as users load it (``from_pretrained``) keeps its packed path through a change of mode.

transformers 5.25 (with ``kernels`` installed) kernelizes a loaded model again on ``model.train()``, which takes
every layer's instance ``forward`` off; the Trainer calls ``model.train()`` at each step. Measured here: after
``enable_packing`` and a switch to training, the packed row's logits still equal each example run alone.
"""

from __future__ import annotations

import torch
from _hybrids import tiny_hybrid

from packing_collators import FlatteningCollator, enable_packing, probe_packing


def test_a_loaded_hybrid_keeps_its_packed_path_after_model_train(tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_hybrid("qwen3_5_text", defaults=("use_cache",)).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    enable_packing(model)
    model.train()
    model.eval()
    model.train()
    with torch.no_grad():
        report = probe_packing(model, FlatteningCollator())
    assert report.passed, report.summary()
