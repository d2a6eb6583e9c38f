"""A decode pod out of KV blocks while only image prompts run on it: it cannot recompute an image's placeholders (the
image stayed on the prefill pod), so it ends the newer request RESOURCE_EXHAUSTED, and the router prefills that one
again, image included, and decodes it once there is room: both streams give the tokens of their unpreempted runs.

Its own 1 prefill + 1 decode cluster serving the tiny random LLaVA with 7 KV blocks a pod: each prompt takes 3
blocks and grows to 6, so two running at once cannot both finish. NOTE: soak: a cluster of its own takes minutes to
start on CI's 2 shared cores; the default run checks the same path without processes
(tests/engine/multimodal/test_llava_preemption.py, tests/router/test_request_retries.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from cli.cluster import LocalCluster
from pdserve.v1 import generation_pb2, generation_pb2_grpc, sampling_pb2
from tests.e2e.support import HEARTBEAT_S, cluster_config
from tests.e2e.vlm_checkpoint import save_tiny_vlm
from tests.engine.multimodal.vlm_factory import make_image

pytestmark = pytest.mark.soak

NUM_BLOCKS = 7
MAX_TOKENS = 60
TEXT = "What is in this image?"


@pytest.fixture(scope="module")
def stub(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> Iterator[generation_pb2_grpc.GenerationServiceStub]:
    folder = save_tiny_vlm(tmp_path_factory.mktemp("tiny-llava"), smollm2_path)
    pod_args = ("--heartbeat-s", str(HEARTBEAT_S), "--num-blocks", str(NUM_BLOCKS))
    config = cluster_config(tmp_path_factory.mktemp("vlm-preemption-logs"), model=str(folder), pod_args=pod_args)
    with LocalCluster(config) as cluster, grpc.insecure_channel(cluster.router_address) as channel:
        yield generation_pb2_grpc.GenerationServiceStub(channel)


def _request(image: bytes) -> generation_pb2.GenerateRequest:
    parts = [
        generation_pb2.ContentPart(text=TEXT),
        generation_pb2.ContentPart(image=generation_pb2.ImagePart(data=image)),
    ]
    message = generation_pb2.ChatMessage(role="user", content_parts=parts)
    return generation_pb2.GenerateRequest(
        messages=generation_pb2.ChatMessages(messages=[message]),
        sampling_params=sampling_pb2.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
    )


def _generate(stub: generation_pb2_grpc.GenerationServiceStub, image: bytes) -> tuple[list[int], int]:
    """The stream's token ids and the number of legs it took."""
    token_ids: list[int] = []
    num_attempts = 0
    for response in stub.Generate(_request(image), timeout=120):
        token_ids += response.token_ids
        num_attempts = max(num_attempts, response.metrics.num_attempts)
    return token_ids, num_attempts


def test_an_image_prompt_ended_by_a_full_decode_pod_is_served_again_exactly(
    stub: generation_pb2_grpc.GenerationServiceStub,
) -> None:
    images = [make_image(40, 30, seed=1), make_image(23, 50, seed=2)]
    alone = [_generate(stub, image) for image in images]
    assert [attempts for _, attempts in alone] == [1, 1]
    assert alone[0][0] != alone[1][0] and all(len(tokens) == MAX_TOKENS for tokens, _ in alone)
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda image: _generate(stub, image), images))
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in alone]
    # NOTE: the ended one took another leg, or more: a Reserve the full pod refuses counts as an attempt too.
    first, second = sorted(attempts for _, attempts in together)
    assert first == 1 and second >= 2
