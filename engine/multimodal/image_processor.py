"""Image bytes -> the vision tower's pixel values, as transformers' CLIP image processor (its PIL backend) computes
them: RGB, shortest edge resized (bicubic, on the 8-bit image), center crop, rescale to [0, 1], normalize.

Malformed or oversized images are the caller's error (InvalidArgumentError naming the field), never a crash: the
header is read first and an image past `max_pixels` is refused before its pixels are decoded.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from common.errors import InvalidArgumentError
from common.image_probe import DEFAULT_MAX_PIXELS, probe_image
from engine.multimodal.vlm_config import ImageProcessorConfig


def open_image(data: bytes, field: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """The decoded RGB image of PNG or JPEG `data`; InvalidArgumentError(field) for anything else or past
    `max_pixels`."""
    image = probe_image(data, field, max_pixels)
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as exc:
        raise InvalidArgumentError(field, f"not a decodable PNG or JPEG image ({exc})") from None
    return image.convert("RGB")


def _resized_size(width: int, height: int, shortest_edge: int) -> tuple[int, int]:
    """(width, height) with the shorter side at `shortest_edge` (transformers' get_resize_output_image_size)."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = shortest_edge, int(shortest_edge * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def _center_crop(pixels: np.ndarray, crop_height: int, crop_width: int) -> np.ndarray:
    """[H, W, C] -> [crop_height, crop_width, C], zero-padded where the image is smaller (as transformers does)."""
    height, width = pixels.shape[:2]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    top_pad, left_pad = -(-(new_height - height) // 2), -(-(new_width - width) // 2)
    padded = np.zeros((new_height, new_width, pixels.shape[2]), dtype=pixels.dtype)
    padded[top_pad : top_pad + height, left_pad : left_pad + width] = pixels
    top = (height - crop_height) // 2 + top_pad
    left = (width - crop_width) // 2 + left_pad
    return padded[max(0, top) : top + crop_height, max(0, left) : left + crop_width]


class ImageProcessor:
    """Decodes and preprocesses one model's images."""

    def __init__(self, config: ImageProcessorConfig, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.config = config
        self.max_pixels = max_pixels

    def pixel_values(self, data: bytes, field: str) -> torch.Tensor:
        """[3, crop_height, crop_width] float32 pixel values of PNG/JPEG `data`."""
        cfg = self.config
        image = open_image(data, field, self.max_pixels)
        if cfg.do_resize:
            size = _resized_size(image.width, image.height, cfg.shortest_edge)
            image = image.resize(size, resample=Image.Resampling(cfg.resample))
        pixels = np.asarray(image)
        if cfg.do_center_crop:
            pixels = _center_crop(pixels, cfg.crop_height, cfg.crop_width)
        values = pixels.astype(np.float32) * np.float32(cfg.rescale_factor)
        if cfg.do_normalize:
            mean, std = np.asarray(cfg.image_mean, np.float32), np.asarray(cfg.image_std, np.float32)
            values = (values - mean) / std
        return torch.from_numpy(np.ascontiguousarray(values.transpose(2, 0, 1)))
