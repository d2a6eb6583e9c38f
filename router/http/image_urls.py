"""OpenAI chat `image_url` parts -> image bytes: `data:` URLs decoded in place; http(s) URLs fetched only with
--enable-remote-images, from the allowed domains, up to --max-image-bytes, within --remote-image-timeout-s.

Remote images are fetched before the body is parsed (`RemoteImages.fetch`, off the event loop), so parsing stays
synchronous: `image_bytes` finds a fetched URL's bytes in what `fetch` returned.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from common.errors import InvalidArgumentError
from router.config import RouterConfig

_REMOTE_SCHEMES = ("http", "https")


def image_url_parts(body: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, url) of every image_url part of the body's messages."""
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = part_url(part)
                if url is not None:
                    yield f"messages[{i}].content[{j}].image_url", url


def part_url(part: Mapping[str, Any]) -> str | None:
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    return url if isinstance(url, str) else None


def decode_data_url(url: str, field: str) -> bytes:
    """The bytes of a `data:[<media type>];base64,<data>` URL."""
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise InvalidArgumentError(field, "a data URL must be base64: data:image/png;base64,...")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError(field, "the data URL's base64 payload is malformed") from None


def image_bytes(url: str, field: str, fetched: Mapping[str, bytes]) -> bytes:
    """The image of an image_url part: a data URL's bytes, or a remote URL's as `RemoteImages.fetch` got them."""
    if url.startswith("data:"):
        return decode_data_url(url, field)
    if url in fetched:
        return fetched[url]
    if urlsplit(url).scheme in _REMOTE_SCHEMES:
        raise InvalidArgumentError(field, "remote image URLs are off (the router's --enable-remote-images)")
    raise InvalidArgumentError(field, "must be a data: URL (or an http(s) URL with --enable-remote-images)")


class RemoteImages:
    def __init__(self, config: RouterConfig) -> None:
        self._enabled = config.enable_remote_images
        self._domains = config.media_domains
        self._max_bytes = config.max_image_bytes
        self._timeout_s = config.remote_image_timeout_s

    async def fetch(self, body: Mapping[str, Any]) -> dict[str, bytes]:
        """Every remote image of the body's messages, by URL (none unless enabled)."""
        if not self._enabled:
            return {}
        remote = {url: field for field, url in image_url_parts(body) if urlsplit(url).scheme in _REMOTE_SCHEMES}
        for url, field in remote.items():
            host = (urlsplit(url).hostname or "").lower()
            if self._domains and host not in self._domains:
                raise InvalidArgumentError(field, f"host {host!r} is not in --allowed-media-domains")
        got = await asyncio.gather(*(asyncio.to_thread(self._get, url, field) for url, field in remote.items()))
        return dict(zip(remote, got, strict=True))

    def _get(self, url: str, field: str) -> bytes:
        try:
            with urllib.request.urlopen(url, timeout=self._timeout_s) as response:
                data: bytes = response.read(self._max_bytes + 1)
        except (urllib.error.URLError, TimeoutError, ValueError, OSError) as exc:
            raise InvalidArgumentError(field, f"fetching the image failed: {exc}") from None
        if len(data) > self._max_bytes:
            raise InvalidArgumentError(field, f"the image is over {self._max_bytes} bytes")
        return data
