"""Fine-tune a vision-language model packed: images and text of several examples in one row, each exact.

``PackingTrainer`` calls ``enable_packing(model)``: each example's multimodal rotary positions are
computed on their own, the vision tower sees each image alone, and ``FlatteningCollator`` lays the
examples end to end with their images concatenated in order (text-only examples mixed in). The
sampler's token budget counts vision patches too. Nothing else changes in a Trainer script::

    trainer = PackingTrainer(model=model, args=args, train_dataset=processed)   # processor outputs

By default it runs offline: a tiny Qwen2.5-VL-style model from a config (random weights) and
synthetic captioning examples, half with an image of random size. With ``--model`` a hub name
(e.g. ``Qwen/Qwen2.5-VL-3B-Instruct``, network needed) it loads the checkpoint and its processor
and builds the same synthetic examples through the processor (docs/multimodal.md has the recipe
for a real dataset).

    python examples/sft_vlm.py                                    # CPU or one GPU
    CUDA_VISIBLE_DEVICES=0 python examples/sft_vlm.py --model Qwen/Qwen2.5-VL-3B-Instruct
    torchrun --nproc-per-node 2 examples/sft_vlm.py               # several GPUs: one process each
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from offline_data import hub_options
from transformers import TrainingArguments

from packing_collators import PackingTrainer

GRIDS = ((4, 4), (4, 8), (8, 8), (8, 12))  # patch grids (h, w) of the offline images: 4 to 24 placeholders


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen2.5-vl", help="hub name or path of a Qwen2-VL-style model")
    parser.add_argument("--examples", type=int, default=96, help="synthetic examples (half with an image)")
    parser.add_argument("--max-tokens-per-batch", type=int, default=1024, help="text tokens + vision patches")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--attn-implementation", default="sdpa", help="sdpa, flash_attention_2/4, packing_varlen")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def tiny_model(seed: int):
    """A 2-layer Qwen2.5-VL-style model (vision: 2 blocks, patches of 2, 2x2 merge), its token ids in a 512 vocab."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, use_cache=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2]})  # fmt: skip
    vision = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=2,
                  window_size=8, fullatt_block_indexes=[1])  # fmt: skip
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=511, video_token_id=510,
                              vision_start_token_id=509, vision_end_token_id=508)  # fmt: skip
    config.use_cache = False
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config)


def offline_example(config, rng, with_image: bool) -> dict:
    """What a processor returns for one captioning example: tokens with the image's placeholders, its patches."""
    vision = config.vision_config
    caption = rng.integers(0, 500, int(rng.integers(8, 48))).tolist()
    ids, kinds, example = caption, [0] * len(caption), {}
    if with_image:
        h, w = GRIDS[int(rng.integers(len(GRIDS)))]
        placeholders = h * w // vision.spatial_merge_size**2
        image = [config.vision_start_token_id, *[config.image_token_id] * placeholders, config.vision_end_token_id]
        ids, kinds = image + caption, [0, *[1] * placeholders, 0] + kinds
        width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        example = {
            "pixel_values": rng.standard_normal((h * w, width)).astype(np.float32),
            "image_grid_thw": [[1, h, w]],
        }
    labels = [-100 if k else t for t, k in zip(ids, kinds)]  # the caption is trained, not the image placeholders
    return {"input_ids": ids, "mm_token_type_ids": kinds, "labels": labels, **example}


def hub_examples(name: str, count: int, rng) -> tuple[object, list[dict]]:
    """A checkpoint, and synthetic examples built by its processor (images of random pixels, random captions)."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    options = hub_options(name)  # a hub name out of reach (offline, no network): said now, not after retries
    processor = AutoProcessor.from_pretrained(name, **options)
    model = AutoModelForImageTextToText.from_pretrained(name, dtype=torch.bfloat16, **options)
    # the language model reads its text config's use_cache (True in the checkpoint), not model.config's;
    # FlatteningCollator's batches say use_cache=False anyway, so this matters only to another collator
    model.config.get_text_config().use_cache = False
    out = []
    for i in range(count):
        content = [{"type": "text", "text": "Describe the picture." if i % 2 == 0 else "Say something."}]
        images = None
        if i % 2 == 0:
            side = int(rng.choice([224, 336, 448]))
            images = [Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))]
            content.insert(0, {"type": "image"})
        messages = [{"role": "user", "content": content}, {"role": "assistant", "content": "A test pattern."}]
        text = processor.apply_chat_template(messages, tokenize=False)
        encoded = processor(text=[text], images=images, return_tensors="np", return_mm_token_type_ids=True)
        example = {k: v[0].tolist() for k, v in encoded.items() if k in ("input_ids", "mm_token_type_ids")}
        if images:
            example.update(pixel_values=encoded["pixel_values"], image_grid_thw=encoded["image_grid_thw"].tolist())
        example["labels"] = [-100 if k else t for t, k in zip(example["input_ids"], example["mm_token_type_ids"])]
        out.append(example)
    return model, out


def packed_and_alone(model, collator, examples: list[dict]) -> tuple[float, float]:
    """The loss of ``examples`` packed in one row, and the same loss with each example alone (token-weighted),
    before training: what packing must not change."""
    device = next(model.parameters()).device

    def loss_and_targets(batch: dict) -> tuple[float, int]:
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        return float(model(**batch).loss), int((batch["labels"][:, 1:] != -100).sum())

    model.eval()
    with torch.no_grad():
        packed, _ = loss_and_targets(collator(examples))
        alone = [loss_and_targets(collator([example])) for example in examples]
    model.train()
    return packed, sum(loss * n for loss, n in alone) / sum(n for _, n in alone)


def main() -> None:
    from datasets import Dataset

    args = arguments()
    rng = np.random.default_rng(args.seed)
    if args.model == "tiny-qwen2.5-vl":
        model = tiny_model(args.seed)
        examples = [offline_example(model.config, rng, with_image=i % 2 == 0) for i in range(args.examples)]
    else:
        model, examples = hub_examples(args.model, args.examples, rng)
    model.set_attn_implementation({"text_config": args.attn_implementation, "vision_config": "sdpa"})
    gpu = torch.cuda.is_available()
    training_args = TrainingArguments(
        output_dir=str(Path(__file__).resolve().parent / ".cache" / "runs"), max_steps=args.max_steps,
        learning_rate=args.lr, logging_steps=1, save_strategy="no", report_to="none", seed=args.seed,
        use_cpu=not gpu, bf16=gpu, per_device_train_batch_size=8,
    )  # fmt: skip
    trainer = PackingTrainer(
        model=model, args=training_args, train_dataset=Dataset.from_list(examples),
        max_tokens_per_batch=args.max_tokens_per_batch,
    )  # fmt: skip
    first = examples[:4]  # two with an image, two text only
    packed, alone = packed_and_alone(trainer.model, trainer.data_collator, first)
    result = trainer.train()
    images = sum(1 for e in examples if "pixel_values" in e)
    patches = sum(int(np.prod(e["image_grid_thw"], axis=1).sum()) for e in examples if "image_grid_thw" in e)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"\n== PackingTrainer, vision-language ({type(model).__name__}) ==")
    print(f"examples:       {len(examples)} ({images} with an image, {len(examples) - images} text only)")
    print(f"text tokens:    {sum(len(e['input_ids']) for e in examples):,}; vision patches {patches:,}")
    print(f"steps:          {trainer.state.global_step} in {result.metrics['train_runtime']:.1f} s")
    print(f"losses:         {', '.join(f'{x:.3f}' for x in losses)}")
    print(f"packed = alone: {packed:.6f} vs {alone:.6f} before training, the first {len(first)} examples in one row "
          f"or each alone (|difference| {abs(packed - alone):.1e})")  # fmt: skip


if __name__ == "__main__":
    main()
