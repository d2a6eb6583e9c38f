"""A random-weight LLaVA checkpoint (CLIP tower + projector + Llama decoder), fixed generated images, and
transformers' greedy output on them: the oracle of the image path."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration
from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

from common.multimodal import ImageInput, expand_image_tokens
from common.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from tests.engine.model_factory import generate_greedy

IMAGE_SIZE = 28
PATCH_SIZE = 7
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
PREPROCESSOR = {
    "size": {"shortest_edge": IMAGE_SIZE},
    "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    "resample": 3,
    "do_center_crop": True,
    "do_normalize": True,
    "do_resize": True,
    "do_rescale": True,
    "image_processor_type": "LlavaImageProcessor",
}


def tiny_llava_config(vocab_size: int = 512, image_token_id: int = 500) -> LlavaConfig:
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=16,
    )
    text = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=image_token_id, image_seq_length=NUM_IMAGE_TOKENS
    )


def save_tiny_llava(folder: Path, config: LlavaConfig | None = None, seed: int = 0) -> Path:
    """The random-weight checkpoint in float32 (config.json, safetensors, preprocessor_config.json)."""
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config or tiny_llava_config()).to(torch.float32)
    with torch.no_grad():
        # NOTE: at the default init (std 0.02) the image embeddings are too faint to sway a greedy token: scaled up,
        # the image decides the output, so the oracle sees a wrong image path.
        model.model.multi_modal_projector.linear_2.weight.mul_(30.0)
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return folder


def make_image(width: int, height: int, seed: int, fmt: str = "PNG") -> bytes:
    """A fixed image: a color gradient with seeded noise, encoded as PNG or JPEG."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.stack([xs * 255 // max(width - 1, 1), ys * 255 // max(height - 1, 1), (xs + ys) % 256], axis=-1)
    pixels = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def hf_pixel_values(images: list[bytes]) -> torch.Tensor:
    """transformers' LLaVA preprocessing (its PIL backend) of the images: [N, 3, H, W]."""
    processor = LlavaImageProcessorPil(**{k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"})
    decoded = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    return torch.as_tensor(np.stack(processor(decoded)["pixel_values"]))


@torch.no_grad()
def hf_llava_greedy(
    folder: Path, prompts: list[tuple[list[int], list[bytes]]], max_new_tokens: int, device: str = "cpu"
) -> list[list[int]]:
    """transformers generate(do_sample=False) on each (prompt with expanded image tokens, its images)."""
    model = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    outputs = []
    for token_ids, images in prompts:
        inputs = {"pixel_values": hf_pixel_values(images).to(device)} if images else {}
        outputs.append(generate_greedy(model, torch.tensor([token_ids], device=device), max_new_tokens, **inputs))
    return outputs


IMAGE_TOKEN = 500
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
IMAGES = [make_image(40, 30, seed=1), make_image(23, 50, seed=2, fmt="JPEG"), make_image(28, 28, seed=3)]


def image_prompts() -> list[tuple[list[int], list[ImageInput]]]:
    """Prompts with one image token per image (expanded here): equal text with different images, the same image in
    two prompts, two images in one, an image first."""
    rng = random.Random(0)
    text = [rng.randrange(400) for _ in range(40)]
    shapes = [
        ([*text[:5], IMAGE_TOKEN, *text[5:20]], [IMAGES[0]]),
        ([*text[:5], IMAGE_TOKEN, *text[5:20]], [IMAGES[1]]),
        ([*text[:5], IMAGE_TOKEN, *text[5:30]], [IMAGES[0]]),
        ([*text[:3], IMAGE_TOKEN, *text[3:9], IMAGE_TOKEN, *text[9:12]], [IMAGES[2], IMAGES[1]]),
        ([IMAGE_TOKEN, *text[:7]], [IMAGES[2]]),
        (text[:33], []),
    ]
    return [expand_image_tokens(ids, IMAGE_TOKEN, NUM_IMAGE_TOKENS, images) for ids, images in shapes]


def greedy_one_by_one(
    engine: LLMEngine, prompts: list[tuple[list[int], list[ImageInput]]], tag: str
) -> list[list[int]]:
    """One request at a time, so a later prompt can hit the blocks an earlier one cached."""
    outputs = []
    for i, (ids, images) in enumerate(prompts):
        engine.add_request(f"{tag}{i}", ids, GREEDY, images=images)
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens.extend(out.new_token_ids)
        outputs.append(tokens)
    return outputs
