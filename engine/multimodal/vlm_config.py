"""The vision side of a LLaVA checkpoint, read from its `config.json` (and `preprocessor_config.json`).

LLaVA (`LlavaForConditionalGeneration`): a CLIP vision tower, a two-layer projector, and a Llama-family text decoder
(`text_config`, which `engine.models.arch_config` reads). Each image becomes `num_image_tokens` placeholder tokens
in the prompt whose embeddings are the projector's outputs: plain embeddings, positioned with the decoder's 1-D RoPE
like any token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VISION_LANGUAGE_ARCHITECTURES = ("LlavaForConditionalGeneration",)
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class VisionTowerConfig:
    """A CLIP vision transformer's shape."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    layer_norm_eps: float
    hidden_act: str

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True, slots=True)
class ImageProcessorConfig:
    """CLIP preprocessing: resize the shortest edge (bicubic), center crop, rescale, normalize."""

    shortest_edge: int
    crop_height: int
    crop_width: int
    resample: int
    rescale_factor: float
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    do_resize: bool
    do_center_crop: bool
    do_normalize: bool

    @classmethod
    def from_dict(cls, raw: dict[str, Any], image_size: int) -> ImageProcessorConfig:
        size, crop = raw.get("size") or {}, raw.get("crop_size") or {}
        return cls(
            shortest_edge=int(size.get("shortest_edge", size.get("height", image_size))),
            crop_height=int(crop.get("height", image_size)),
            crop_width=int(crop.get("width", image_size)),
            resample=int(raw.get("resample", 3)),
            rescale_factor=float(raw.get("rescale_factor", 1 / 255)),
            image_mean=tuple(raw.get("image_mean", _CLIP_MEAN)),
            image_std=tuple(raw.get("image_std", _CLIP_STD)),
            do_resize=bool(raw.get("do_resize", True)),
            do_center_crop=bool(raw.get("do_center_crop", True)),
            do_normalize=bool(raw.get("do_normalize", True)),
        )


@dataclass(frozen=True, slots=True)
class VisionLanguageConfig:
    vision: VisionTowerConfig
    processor: ImageProcessorConfig
    image_token_id: int
    feature_layers: tuple[int, ...]
    keep_cls: bool  # vision_feature_select_strategy "full" (else "default": the CLS token is dropped)
    projector_act: str
    projector_bias: bool
    text_hidden_size: int

    @property
    def num_image_tokens(self) -> int:
        return self.vision.num_patches + (1 if self.keep_cls else 0)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], processor: dict[str, Any]) -> VisionLanguageConfig:
        vc = raw["vision_config"]
        if vc.get("model_type", "clip_vision_model") != "clip_vision_model":
            raise ValueError(f"vision tower {vc.get('model_type')!r} not supported; supported: clip_vision_model")
        layer = raw.get("vision_feature_layer", -2)
        vision = VisionTowerConfig(
            hidden_size=vc["hidden_size"],
            intermediate_size=vc["intermediate_size"],
            num_layers=vc["num_hidden_layers"],
            num_heads=vc["num_attention_heads"],
            image_size=vc["image_size"],
            patch_size=vc["patch_size"],
            num_channels=vc.get("num_channels", 3),
            layer_norm_eps=vc.get("layer_norm_eps", 1e-5),
            hidden_act=vc.get("hidden_act", "quick_gelu"),
        )
        return cls(
            vision=vision,
            processor=ImageProcessorConfig.from_dict(processor, vision.image_size),
            image_token_id=raw.get("image_token_index", raw.get("image_token_id", 32000)),
            feature_layers=tuple(layer) if isinstance(layer, list) else (layer,),
            keep_cls=raw.get("vision_feature_select_strategy", "default") == "full",
            projector_act=raw.get("projector_hidden_act", "gelu"),
            projector_bias=bool(raw.get("multimodal_projector_bias", True)),
            text_hidden_size=raw["text_config"]["hidden_size"],
        )

    @classmethod
    def from_folder(cls, folder: Path) -> VisionLanguageConfig | None:
        """The checkpoint's vision side; None for a text-only model."""
        raw = json.loads((folder / "config.json").read_text())
        if not set(raw.get("architectures") or ()) & set(VISION_LANGUAGE_ARCHITECTURES):
            return None
        processor_file = folder / "preprocessor_config.json"
        processor = json.loads(processor_file.read_text()) if processor_file.exists() else {}
        return cls.from_dict(raw, processor)


_TEXT_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def text_decoder_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A vision-language config's `text_config` as a causal LM's own config.json would read (with its
    architecture), or `raw` itself for a text-only model."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return raw
    model_type = text.get("model_type", "llama")
    if model_type not in _TEXT_ARCHITECTURES:
        raise ValueError(f"text decoder {model_type!r} not supported; supported: {', '.join(_TEXT_ARCHITECTURES)}")
    return {"architectures": [_TEXT_ARCHITECTURES[model_type]], **text}
