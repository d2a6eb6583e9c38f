"""Preprocessing matches transformers' LLaVA image processor; bad or oversized images are InvalidArgumentError."""

from __future__ import annotations

import pytest
import torch

from common.errors import InvalidArgumentError
from engine.multimodal.image_processor import ImageProcessor
from engine.multimodal.vlm_config import ImageProcessorConfig
from tests.engine.multimodal.vlm_factory import IMAGE_SIZE, PREPROCESSOR, hf_pixel_values, make_image

CONFIG = ImageProcessorConfig.from_dict(PREPROCESSOR, IMAGE_SIZE)


@pytest.mark.parametrize(
    ("width", "height", "fmt"), [(40, 30, "PNG"), (23, 50, "JPEG"), (28, 28, "PNG"), (13, 9, "PNG"), (301, 77, "JPEG")]
)
def test_pixel_values_match_transformers(width: int, height: int, fmt: str) -> None:
    data = make_image(width, height, seed=width, fmt=fmt)
    ours = ImageProcessor(CONFIG).pixel_values(data, "images[0]")
    assert ours.shape == (3, IMAGE_SIZE, IMAGE_SIZE) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, hf_pixel_values([data])[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a decodable PNG or JPEG"),
        (b"GIF89a\x01\x00\x01\x00", "not a decodable PNG or JPEG"),
        (make_image(20, 20, seed=0)[:60], "not a decodable PNG or JPEG"),
    ],
)
def test_malformed_images_are_invalid_arguments(data: bytes, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as info:
        ImageProcessor(CONFIG).pixel_values(data, "messages[0].content[1]")
    assert info.value.field == "messages[0].content[1]"


def test_images_past_the_pixel_limit_are_refused_before_decoding() -> None:
    with pytest.raises(InvalidArgumentError, match="60x50 pixels is over the 2000 limit"):
        ImageProcessor(CONFIG, max_pixels=2000).pixel_values(make_image(60, 50, seed=0), "images[0]")
