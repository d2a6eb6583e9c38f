"""A cheap look at an image's header: its format and size, without decoding its pixels (the router checks images
this way; the prefill pod decodes them, `engine.multimodal.image_processor`)."""

from __future__ import annotations

import io
import warnings
from typing import TYPE_CHECKING

from common.errors import InvalidArgumentError

if TYPE_CHECKING:
    from PIL import Image

IMAGE_FORMATS = ("PNG", "JPEG")
DEFAULT_MAX_PIXELS = 64 * 2**20


def probe_image(data: bytes, field: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """The opened (not yet decoded) PNG or JPEG image of `data`; InvalidArgumentError(field) for anything else or an
    image of more than `max_pixels`."""
    # NOTE: Pillow is imported with the first image: a text-only deployment never loads it.
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidArgumentError(field, f"not a decodable PNG or JPEG image ({exc})") from None
    except Image.DecompressionBombWarning as exc:
        raise InvalidArgumentError(field, f"image too large ({exc})") from None
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidArgumentError(field, f"image of {width}x{height} pixels is over the {max_pixels} limit")
    return image
