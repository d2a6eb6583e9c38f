"""Acceptance (issue 32, part 2): an image through the router. The openai SDK sends a chat with an image (a data URL)
to /v1/chat/completions and gets the text the gRPC API gets for the same message (and a different image gets a
different text). Too many images, a malformed one, or a remote URL while fetching is off
are INVALID_ARGUMENT (HTTP 400) naming the field. Its own 1 prefill + 1 decode cluster serving a tiny random LLaVA.

NOTE: soak: the cluster of its own (a model no other e2e test serves) takes minutes to start on CI's 2 shared cores,
past the default run's budget; the image path's parts are checked in the default run without processes
(tests/engine/multimodal, tests/router/test_prompt_images.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from cli.cluster import LocalCluster
from cli.ports import free_port
from pdserve.v1 import generation_pb2, generation_pb2_grpc, sampling_pb2
from tests.e2e.support import cluster_config
from tests.e2e.test_http_api import _openai_python
from tests.e2e.vlm_checkpoint import save_tiny_vlm
from tests.engine.multimodal.vlm_factory import NUM_IMAGE_TOKENS, make_image

pytestmark = pytest.mark.soak

MAX_TOKENS = 8
TEXT = "What is in this image?"


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny-llava"), smollm2_path)


@pytest.fixture(scope="module")
def vlm_cluster(vlm_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = cluster_config(
        tmp_path_factory.mktemp("vlm-cluster-logs"),
        http_port=free_port(),
        model=str(vlm_folder),
        router_args=("--limit-mm-per-prompt", "image=1"),
    )
    with LocalCluster(config) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def stub(vlm_cluster: LocalCluster) -> Iterator[generation_pb2_grpc.GenerationServiceStub]:
    with grpc.insecure_channel(vlm_cluster.router_address) as channel:
        yield generation_pb2_grpc.GenerationServiceStub(channel)


def _request(*images: bytes) -> generation_pb2.GenerateRequest:
    parts = [generation_pb2.ContentPart(text=TEXT)]
    parts += [generation_pb2.ContentPart(image=generation_pb2.ImagePart(data=image)) for image in images]
    message = generation_pb2.ChatMessage(role="user", content_parts=parts)
    return generation_pb2.GenerateRequest(
        messages=generation_pb2.ChatMessages(messages=[message]),
        sampling_params=sampling_pb2.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
    )


def _generate(
    stub: generation_pb2_grpc.GenerationServiceStub, request: generation_pb2.GenerateRequest
) -> tuple[str, list[int]]:
    text, token_ids = "", []
    for response in stub.Generate(request, timeout=120):
        text += response.text
        token_ids += response.token_ids
    return text, token_ids


def test_the_openai_sdk_gets_what_the_grpc_api_gets(
    vlm_cluster: LocalCluster, vlm_folder: Path, stub: generation_pb2_grpc.GenerationServiceStub, tmp_path: Path
) -> None:
    image = make_image(40, 30, seed=1)
    (tmp_path / "image.png").write_bytes(image)
    script = Path(__file__).parents[2] / "scripts" / "openai_image_check.py"
    args = ["--base-url", f"{vlm_cluster.http_url}/v1", "--model", str(vlm_folder), "--image", tmp_path / "image.png"]
    checked = subprocess.run(
        [_openai_python(), script, *args, "--text", TEXT, "--max-tokens", str(MAX_TOKENS)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert checked.returncode == 0, checked.stderr
    got = json.loads(checked.stdout)
    text, token_ids = _generate(stub, _request(image))
    assert len(token_ids) == MAX_TOKENS or token_ids[-1] == 2
    assert got["text"] == got["stream_text"] == text
    assert got["prompt_tokens"] > NUM_IMAGE_TOKENS
    other_text, _ = _generate(stub, _request(make_image(23, 50, seed=2)))
    assert other_text != text  # the image, not just the text, decides the output


def test_bad_images_are_invalid_arguments(
    vlm_cluster: LocalCluster, stub: generation_pb2_grpc.GenerationServiceStub
) -> None:
    image = make_image(20, 20, seed=0)
    with pytest.raises(grpc.RpcError) as too_many:
        _generate(stub, _request(image, image))
    assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--limit-mm-per-prompt image=1" in (too_many.value.details() or "")
    with pytest.raises(grpc.RpcError) as malformed:
        _generate(stub, _request(b"\x89PNG\r\n\x1a\n garbage"))
    assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a decodable PNG or JPEG" in (malformed.value.details() or "")
    content = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    response = httpx.post(f"{vlm_cluster.http_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert "--enable-remote-images" in response.json()["error"]["message"]
