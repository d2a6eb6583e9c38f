"""The OpenAI-compatible HTTP API and the control RPCs over real processes: a cluster of its own (1 prefill,
1 decode, the router with --http-port, bearer tokens, one stream per client), checked against the gRPC API.

Greedy text and usage equal the gRPC API's for the same prompt; a bad field is a 400 naming it; a second stream of
a client at its limit is a 429 with Retry-After; a dropped connection and an Abort free the request's KV within
2 s (plus one heartbeat); GetServerInfo describes the cluster; GetLoad shows a pod DRAINING; reflection v1 lists
the new RPCs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from cli.cluster import LocalCluster
from cli.ports import free_port
from client.generation_client import GenerationClient
from common.auth import bearer_metadata
from common.sampling_params import SamplingParams
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from tests.e2e.support import HEARTBEAT_S, Oracle, cluster_config, run, wait_until
from tests.e2e.test_cancellation import STORY, holding, idle

pytestmark = pytest.mark.slow

TOKEN = "http-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CANCEL_BOUND_S = 2.0 + HEARTBEAT_S
PROMPT = "The three primary colors are"
MESSAGES = [{"role": "user", "content": "Name a fruit."}]
OPENAI_VENV = Path("/tmp/openai-venv")
"""Where the `openai` SDK lives, apart from pdserve's environment."""


@pytest.fixture(scope="module")
def http_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = cluster_config(
        tmp_path_factory.mktemp("http-cluster-logs"),
        http_port=free_port(),
        router_args=("--max-streams-per-client", "1"),
        env={"PDSERVE_AUTH_TOKENS": TOKEN},
    )
    with LocalCluster(config) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def http(http_cluster: LocalCluster) -> Iterator[httpx.Client]:
    assert http_cluster.http_url is not None
    with httpx.Client(base_url=http_cluster.http_url, headers=AUTH, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def grpc_client(http_cluster: LocalCluster) -> Iterator[GenerationClient]:
    with GenerationClient(http_cluster.router_address, token=TOKEN) as client:
        yield client


@pytest.fixture(scope="module")
def stub(http_cluster: LocalCluster) -> Iterator[generation_pb2_grpc.GenerationServiceStub]:
    with grpc.insecure_channel(http_cluster.router_address) as channel:
        yield generation_pb2_grpc.GenerationServiceStub(channel)


def _client_headers() -> dict[str, str]:
    """A client id of its own: the cluster admits one stream per client."""
    return {"x-client-id": uuid.uuid4().hex}


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line.removeprefix("data: "))


def _stream(http: httpx.Client, path: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """Every event of a streamed request, and the raw body (to check its framing)."""
    with http.stream("POST", path, json={**body, "stream": True}, headers=_client_headers()) as response:
        assert response.status_code == 200, response.read()
        raw = response.read().decode()
    events = [json.loads(line.removeprefix("data: ")) for line in raw.split("\n\n") if line.startswith("data: {")]
    return events, raw


def test_completions_equal_the_grpc_api(http: httpx.Client, grpc_client: GenerationClient) -> None:
    expected = run(grpc_client, prompt=PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True)
    body = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    response = http.post("/v1/completions", json=body, headers=_client_headers())
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["choices"][0]["text"] == expected.text
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {
        "prompt_tokens": expected.usage.prompt_tokens,
        "completion_tokens": 12,
        "total_tokens": expected.usage.prompt_tokens + 12,
        "prompt_tokens_details": {"cached_tokens": answer["usage"]["prompt_tokens_details"]["cached_tokens"]},
    }
    events, raw = _stream(http, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert raw.endswith("data: [DONE]\n\n")
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == expected.text
    assert len([e for e in events if e["choices"]]) == 12, "one token per chunk"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 12
    assert events[-1]["usage"]["prompt_tokens"] == expected.usage.prompt_tokens


def test_chat_equals_the_grpc_api(http: httpx.Client, grpc_client: GenerationClient) -> None:
    expected = run(grpc_client, messages=MESSAGES, max_tokens=10, temperature=0.0)
    body = {"model": "smollm2-135m", "messages": MESSAGES, "max_tokens": 10, "temperature": 0}
    answer = http.post("/v1/chat/completions", json=body, headers=_client_headers()).json()
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    assert answer["usage"]["prompt_tokens"] == expected.usage.prompt_tokens
    assert answer["usage"]["completion_tokens"] == expected.usage.completion_tokens
    events, _ = _stream(http, "/v1/chat/completions", body)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"]["content"] for e in events) == expected.text
    assert events[-1]["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]


def test_models_tokenize_detokenize_health_metrics(
    http: httpx.Client, grpc_client: GenerationClient, http_cluster: LocalCluster
) -> None:
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["smollm2-135m"]
    tokens = http.post("/tokenize", json={"prompt": PROMPT}).json()
    expected = run(grpc_client, prompt=PROMPT, max_tokens=1, temperature=0.0)
    assert tokens["count"] == len(tokens["tokens"]) == expected.usage.prompt_tokens
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": PROMPT}
    assert httpx.get(f"{http_cluster.http_url}/health").json() == {"status": "serving"}
    assert (
        'pdserve:time_to_first_token_seconds_count{role="router"}' in httpx.get(f"{http_cluster.http_url}/metrics").text
    )


def test_errors_are_openai_shaped(http: httpx.Client, http_cluster: LocalCluster) -> None:
    bad = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}, headers=_client_headers())
    assert bad.status_code == 400
    assert bad.json() == {
        "error": {
            "message": "max_tokens: must be >= 1, got 0",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "INVALID_ARGUMENT",
        }
    }
    too_long = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 9000}, headers=_client_headers())
    assert (too_long.status_code, too_long.json()["error"]["param"]) == (400, "max_tokens")
    unsupported = http.post("/v1/completions", json={"prompt": "x", "min_tokens": 2}, headers=_client_headers())
    assert (unsupported.status_code, unsupported.json()["error"]["param"]) == (400, "min_tokens")
    assert httpx.get(f"{http_cluster.http_url}/v1/models").status_code == 401
    assert httpx.get(f"{http_cluster.http_url}/v1/models", headers={"Authorization": "Bearer no"}).status_code == 403


def test_a_client_over_its_stream_limit_gets_429_with_retry_after(http: httpx.Client) -> None:
    headers = {"x-client-id": "hog"}
    body = {"prompt": STORY, "max_tokens": 300, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body, headers=headers) as first:
        assert first.status_code == 200
        refused = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=headers)
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"


def test_a_dropped_connection_frees_the_kv(http: httpx.Client, http_cluster: LocalCluster) -> None:
    assert wait_until(lambda: idle(http_cluster.pod_infos()), 10.0), http_cluster.pod_infos()
    body = {"prompt": STORY * 2, "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/completions", json=body, headers=_client_headers()) as response:
        events = _events(response)
        assert [next(events)["choices"][0]["index"] for _ in range(3)] == [0, 0, 0]
        assert wait_until(lambda: holding("decode")(http_cluster), 2.0), http_cluster.pod_infos()
    dropped_at = time.monotonic()
    assert wait_until(lambda: idle(http_cluster.pod_infos()), CANCEL_BOUND_S), http_cluster.pod_infos()
    assert time.monotonic() - dropped_at <= CANCEL_BOUND_S


def test_abort_cancels_an_http_stream(
    http: httpx.Client, http_cluster: LocalCluster, stub: generation_pb2_grpc.GenerationServiceStub
) -> None:
    auth = bearer_metadata(TOKEN)
    assert wait_until(lambda: idle(http_cluster.pod_infos()), 10.0), http_cluster.pod_infos()
    body = {"prompt": STORY * 2, "max_tokens": 400, "ignore_eos": True, "stream": True}
    headers = {**_client_headers(), "x-request-id": "abort-me"}
    with http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
        events = _events(response)
        next(events)
        answer = stub.Abort(generation_pb2.AbortRequest(request_id="abort-me"), metadata=auth, timeout=5)
        aborted_at = time.monotonic()
        assert (answer.result, answer.num_aborted) == (generation_pb2.ABORT_RESULT_ABORTED, 1)
        assert list(events)[-1]["error"]["code"] == "CANCELLED"
    assert wait_until(lambda: idle(http_cluster.pod_infos()), CANCEL_BOUND_S), http_cluster.pod_infos()
    assert time.monotonic() - aborted_at <= CANCEL_BOUND_S
    again = stub.Abort(generation_pb2.AbortRequest(request_id="abort-me"), metadata=auth, timeout=5)
    assert again.result == generation_pb2.ABORT_RESULT_ALREADY_FINISHED
    unknown = stub.Abort(generation_pb2.AbortRequest(request_id="never-sent"), metadata=auth, timeout=5)
    assert unknown.result == generation_pb2.ABORT_RESULT_NOT_FOUND


def test_server_info_and_reflection_v1(
    http_cluster: LocalCluster, stub: generation_pb2_grpc.GenerationServiceStub
) -> None:
    info = stub.GetServerInfo(generation_pb2.GetServerInfoRequest(), metadata=bearer_metadata(TOKEN), timeout=5)
    assert list(info.roles) == ["router", "prefill", "decode"]
    assert sorted(p.pod_id for p in info.pods) == sorted(http_cluster.pod_ids)
    assert (info.model.block_size, info.model.max_model_len, info.num_prefill_pods, info.num_decode_pods) == (
        16,
        8192,
        1,
        1,
    )
    assert info.http_port == http_cluster.config.http_port
    with grpc.insecure_channel(http_cluster.router_address) as channel:
        reflect = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        [listed, described] = list(
            reflect(
                iter(
                    [
                        reflection_pb2.ServerReflectionRequest(list_services=""),
                        reflection_pb2.ServerReflectionRequest(file_containing_symbol="pdserve.v1.GenerationService"),
                    ]
                ),
                timeout=5,
            )
        )
    names = {s.name for s in listed.list_services_response.service}
    assert {"pdserve.v1.GenerationService", "grpc.reflection.v1.ServerReflection"} <= names
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    [service] = [s for f in files for s in f.service if s.name == "GenerationService"]
    assert {"Abort", "GetServerInfo", "GetLoad"} <= {m.name for m in service.method}


def _openai_python() -> Path:
    """The Python of a virtualenv holding the `openai` SDK (made when missing); skips when pip cannot get it."""
    python = OPENAI_VENV / "bin" / "python"
    # NOTE: on a fresh machine the venv does not exist yet (running its Python would raise, not fail).
    if python.exists() and subprocess.run([python, "-c", "import openai"], capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", OPENAI_VENV], check=True, timeout=120)
    pip = [python, "-m", "pip", "install", "-q", "--retries", "1", "--timeout", "15", "openai"]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    if installed.returncode != 0:
        pytest.skip(f"pip could not install openai (no PyPI?): {installed.stderr[-500:]}")
    return python


def test_the_openai_sdk_gets_what_the_grpc_api_gets(http_cluster: LocalCluster, grpc_client: GenerationClient) -> None:
    """Acceptance 1: the official SDK, in a virtualenv of its own, against the router's HTTP API."""
    script = Path(__file__).parents[2] / "scripts" / "openai_sdk_check.py"
    max_tokens = 12
    checked = subprocess.run(
        [
            _openai_python(),
            script,
            "--base-url",
            f"{http_cluster.http_url}/v1",
            "--api-key",
            TOKEN,
            "--prompt",
            PROMPT,
            "--chat",
            MESSAGES[0]["content"],
            "--max-tokens",
            str(max_tokens),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert checked.returncode == 0, checked.stderr
    got = json.loads(checked.stdout)
    text = run(grpc_client, prompt=PROMPT, max_tokens=max_tokens, temperature=0.0)
    chat = run(grpc_client, messages=MESSAGES, max_tokens=max_tokens, temperature=0.0)
    assert got["models"] == ["smollm2-135m"]
    for key, expected in (("completion", text), ("completion_stream", text), ("chat", chat), ("chat_stream", chat)):
        usage = {
            "prompt_tokens": expected.usage.prompt_tokens,
            "completion_tokens": expected.usage.completion_tokens,
            "total_tokens": expected.usage.prompt_tokens + expected.usage.completion_tokens,
        }
        assert (got[key]["text"], got[key]["usage"]) == (expected.text, usage), key
    assert got["completion_stream"]["num_chunks"] == text.usage.completion_tokens


BEAM_SCRIPT = """
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2])
answer = client.completions.create(
    model="smollm2-135m", prompt=sys.argv[3], n=2, best_of=3, max_tokens=6, extra_body={"use_beam_search": True}
)
print(json.dumps([choice.text for choice in sorted(answer.choices, key=lambda choice: choice.index)]))
"""


def test_beam_search_over_grpc_and_the_openai_sdk(
    http_cluster: LocalCluster, grpc_client: GenerationClient, oracle: Oracle
) -> None:
    """The decode pod's beam search over the transferred prompt KV returns the offline engine's beams."""
    params = SamplingParams(n=2, best_of=3, temperature=0.0, max_tokens=6, use_beam_search=True)
    expected = oracle.completions(PROMPT, params)
    responses = list(grpc_client.generate(PROMPT, n=2, best_of=3, temperature=0.0, max_tokens=6, use_beam_search=True))
    assert [r.index for r in responses] == [0, 1]
    assert [list(r.token_ids) for r in responses] == [c.token_ids for c in expected]
    assert [r.text for r in responses] == [c.text for c in expected]
    assert [r.cumulative_logprob for r in responses] == pytest.approx(
        [c.cumulative_logprob for c in expected], abs=1e-3
    )
    assert responses[-1].usage.completion_tokens == sum(len(c.token_ids) for c in expected)
    checked = subprocess.run(
        [_openai_python(), "-c", BEAM_SCRIPT, f"{http_cluster.http_url}/v1", TOKEN, PROMPT],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout) == [c.text for c in expected]


def test_get_load_shows_a_draining_pod(
    http: httpx.Client, http_cluster: LocalCluster, stub: generation_pb2_grpc.GenerationServiceStub
) -> None:
    """Last in the module: the decode pod drains away."""
    auth = bearer_metadata(TOKEN)
    load = stub.GetLoad(generation_pb2.GetLoadRequest(), metadata=auth, timeout=5)
    assert load.state == generation_pb2.SERVER_STATE_SERVING
    assert {p.state for p in load.pods} == {generation_pb2.SERVER_STATE_SERVING}
    body = {"prompt": STORY, "max_tokens": 60, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body, headers=_client_headers()) as response:
        events = _events(response)
        next(events)
        [decode_id] = [p for p in http_cluster.pod_ids if p.startswith("decode")]
        http_cluster.drain_pod(decode_id)

        def decode_state() -> int:
            pods = stub.GetLoad(generation_pb2.GetLoadRequest(), metadata=auth, timeout=5).pods
            return next((p.state for p in pods if p.pod.pod_id == decode_id), 0)

        assert wait_until(lambda: decode_state() == generation_pb2.SERVER_STATE_DRAINING, 5.0)
        finished = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert finished[-1]["choices"][0]["finish_reason"] == "length"
