"""The router's side of image inputs, without processes: parsing (gRPC content parts, OpenAI image_url data URLs),
--limit-mm-per-prompt, size and format checks, and the placeholders each image token expands to."""

from __future__ import annotations

import base64

import pytest

from common.errors import InvalidArgumentError
from common.multimodal import ImageInput, block_token_ids, expand_image_tokens, hash_image
from pdserve.v1 import generation_pb2
from router.config import RouterConfig
from router.http.protocol import chat_messages
from router.model_info import ModelInfo
from router.multimodal.prompt_images import PromptImages
from router.server import _chat_messages
from router.tokenizer.tokenizer_pool import ChatMessage
from tests.engine.multimodal.vlm_factory import make_image

PNG = make_image(8, 6, seed=0)
JPEG = make_image(9, 7, seed=1, fmt="JPEG")
VLM = ModelInfo("vlm", 1024, 600, 16, (2,), image_token_id=500, num_image_tokens=4)


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_openai_image_url_parts_become_image_parts() -> None:
    content = [
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": {"url": _data_url(PNG)}},
        {"type": "text", "text": " and "},
        {"type": "image_url", "image_url": {"url": _data_url(JPEG), "detail": "low"}},
    ]
    [message] = chat_messages({"messages": [{"role": "user", "content": content}]})
    assert message == ChatMessage("user", "", ("Compare ", PNG, " and ", JPEG))
    assert message.images == (PNG, JPEG)
    assert message.template_input() == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Compare "},
            {"type": "image"},
            {"type": "text", "text": " and "},
            {"type": "image"},
        ],
    }
    # text-only part lists stay one string, as before
    [text] = chat_messages({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    assert text == ChatMessage("user", "hi")


@pytest.mark.parametrize(
    ("url", "fetched", "message"),
    [
        ("https://example.com/a.png", {}, "remote image URLs are off"),
        ("data:image/png,rawbytes", {}, "must be base64"),
        ("data:image/png;base64,!!!", {}, "payload is malformed"),
        ("file:///etc/passwd", {}, "must be a data: URL"),
    ],
)
def test_bad_image_urls_name_their_part(url: str, fetched: dict[str, bytes], message: str) -> None:
    content = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(InvalidArgumentError, match=message) as info:
        chat_messages({"messages": [{"role": "user", "content": content}]}, fetched)
    assert info.value.field == "messages[0].content[1].image_url"


def test_a_fetched_remote_image_is_taken() -> None:
    url = "https://images.example.com/a.png"
    content = [{"type": "image_url", "image_url": {"url": url}}]
    [message] = chat_messages({"messages": [{"role": "user", "content": content}]}, {url: PNG})
    assert message.parts == (PNG,)


def test_grpc_content_parts() -> None:
    parts = [
        generation_pb2.ContentPart(text="see"),
        generation_pb2.ContentPart(image=generation_pb2.ImagePart(data=PNG)),
    ]
    messages = generation_pb2.ChatMessages(messages=[generation_pb2.ChatMessage(role="user", content_parts=parts)])
    assert _chat_messages(messages) == (ChatMessage("user", "", ("see", PNG)),)
    both = generation_pb2.ChatMessage(role="user", content="x", content_parts=parts)
    with pytest.raises(InvalidArgumentError) as info:
        _chat_messages(generation_pb2.ChatMessages(messages=[both]))
    assert info.value.field == "messages.messages[0].content"


def test_limit_mm_per_prompt() -> None:
    assert RouterConfig().max_images_per_prompt == 8
    assert RouterConfig(limit_mm_per_prompt="image=3").max_images_per_prompt == 3
    assert RouterConfig(limit_mm_per_prompt="").max_images_per_prompt == 0
    for bad in ("video=2", "image=two"):
        with pytest.raises(InvalidArgumentError) as info:
            RouterConfig(limit_mm_per_prompt=bad)
        assert info.value.field == "limit_mm_per_prompt"
    images = PromptImages(VLM, RouterConfig(limit_mm_per_prompt="image=1"))
    with pytest.raises(InvalidArgumentError, match=r"2 images; at most 1 per prompt \(--limit-mm-per-prompt image=1\)"):
        images.check([ChatMessage("user", "", (PNG, "x", JPEG))])


@pytest.mark.parametrize(
    ("model", "data", "message"),
    [
        (ModelInfo("text", 1024, 600, 16, (2,)), PNG, "model text takes no images"),
        (VLM, b"GIF89a....", "not a decodable PNG or JPEG"),
        (VLM, make_image(300, 300, seed=0), "bytes, over 2000"),
        (VLM, make_image(60, 50, seed=0, fmt="JPEG"), "60x50 pixels is over the 1000 limit"),
    ],
)
def test_unusable_images_are_invalid_arguments(model: ModelInfo, data: bytes, message: str) -> None:
    limits = RouterConfig(max_image_bytes=2000, max_image_pixels=1000)
    with pytest.raises(InvalidArgumentError, match=message) as info:
        PromptImages(model, limits).check([ChatMessage("user", "", ("x", data))])
    assert info.value.field == "messages"


def test_image_tokens_expand_to_placeholders_keyed_by_the_image() -> None:
    ids, placed = PromptImages(VLM, RouterConfig()).place([1, 500, 7, 8, 500], [PNG, JPEG])
    assert ids == [1, 500, 500, 500, 500, 7, 8, 500, 500, 500, 500]
    assert placed == (ImageInput(PNG, 1, 4, hash_image(PNG)), ImageInput(JPEG, 7, 4, hash_image(JPEG)))
    hashed = block_token_ids(ids, placed)
    png_id, jpeg_id = placed[0].hash_token_id, placed[1].hash_token_id
    assert hashed == [1, png_id, png_id, png_id, png_id, 7, 8, jpeg_id, jpeg_id, jpeg_id, jpeg_id]
    assert png_id < 0 and jpeg_id < 0 and png_id != jpeg_id
    with pytest.raises(InvalidArgumentError, match="1 image tokens for 2 images"):
        PromptImages(VLM, RouterConfig()).place([1, 500, 7], [PNG, JPEG])
    with pytest.raises(ValueError, match="2 image tokens for 1 images"):
        expand_image_tokens([500, 500], 500, 4, [PNG])
