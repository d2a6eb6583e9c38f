"""Fuzz of the public API and of the pods' own: field values at and past their limits (bad UTF-8, huge, negative,
NaN and infinite numbers, huge strings, many stop strings, empty prompts), fields of the wrong wire type, and
random bytes as the request message. Nothing answers INTERNAL or UNKNOWN, every INVALID_ARGUMENT names a real
field of the request, no process dies, and the cluster still answers " Paris." afterwards.

The default run sends NUM_ROUTER_CASES cases to the router and NUM_POD_CASES to each pod RPC; the soak variant
(`pytest -m soak tests/faults/test_fuzz.py -s`, figures in docs/reliability.md) sends 2,000 and 200.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import grpc
import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from pdserve.v1 import decode_pb2, generation_pb2, kv_transfer_pb2, prefill_pb2, sampling_pb2
from tests.e2e.support import wait_until
from tests.faults.input_support import (
    KV_LEASE_S,
    PARIS,
    FuzzCase,
    answers_paris,
    random_garbage,
    send_all,
    send_all_frames,
    structured_cases,
)
from tests.faults.support import kv_at_baseline, log_errors

NUM_ROUTER_CASES = 300
NUM_POD_CASES = 40
KV_BASELINE_TIMEOUT_S = 4 * KV_LEASE_S
NAN, INF = float("nan"), float("inf")
U32, I32, I64 = 2**32 - 1, 2**31 - 1, 2**63 - 1

SAMPLING: dict[str, list[Any]] = {
    "n": [0, 1, 2, 129, U32],
    "temperature": [0.0, 5e-324, 1e-300, 1e-6, 0.7, 1e300, -1.0, NAN, INF, -INF],
    "top_k": [-(2**31), -2, -1, 0, 1, I32],
    "top_p": [0.0, -0.1, 1e-300, 0.5, 1.0, 1.5, NAN],
    "min_p": [-1.0, 0.0, 0.5, 1.0, 2.0, NAN],
    "seed": [-(2**63), -1, 0, I64 - 1, I64],
    "repetition_penalty": [0.0, -1.0, 1e-300, 1.0, 1.3, 1e300, NAN, INF],
    "presence_penalty": [-3.0, -2.0, 0.0, 2.0, 3.0, NAN, INF],
    "frequency_penalty": [-3.0, -2.0, 0.0, 2.0, 3.0, NAN, -INF],
    "max_tokens": [0, 1, 2, 3, 8192, U32],
    "stop": [[], [""], ["."], ["x" * 600], ["a"] * 40, ["\x00"], ["é✓🙂"]],
    "stop_token_ids": [[0], [U32], [2, 2, 2]],
    "ignore_eos": [True, False],
    "include_stop_str_in_output": [True],
    "logprobs": [True, False],
    "priority": [-(2**31), 0, I32],
}
CHAT = generation_pb2.ChatMessages
MESSAGE = generation_pb2.ChatMessage
GENERATE_VALUES: dict[str, list[Any]] = {
    **{f"sampling_params.{name}": values for name, values in SAMPLING.items()},
    "text": [
        "",
        "Hi",
        "The capital of France is",
        "\x00" * 8,
        "🙂" * 50,
        " hello" * 9000,
        "x" * 2_000_000,
        "y" * 5_000_000,
    ],
    "messages": [
        CHAT(),
        CHAT(messages=[MESSAGE(role="user", content="Hi")]),
        CHAT(messages=[MESSAGE()]),
        CHAT(messages=[MESSAGE(role="user", content="hi")] * 40),
        CHAT(messages=[MESSAGE(role="user", content="z" * 1_100_000)]),
    ],
    "token_ids.token_ids": [[], [0], [1, 2, 3], [49152], [U32], [1] * 8192, [1] * 9000],
    "request_id": ["", "ok-1", "a b", "é", "x" * 300, "\n"],
    "cache_salt": ["", "tenant", "x" * 300],
}
GENERATE_BASE = generation_pb2.GenerateRequest(text="Hi", sampling_params=sampling_pb2.SamplingParams(max_tokens=1))

LAYOUT = kv_transfer_pb2.KVLayout(
    dtype="float32", block_size=16, num_layers=30, num_kv_heads=3, head_dim=64, block_nbytes=737280
)
PREFILL_BASE = prefill_pb2.PrefillRequest(
    request_id="fuzz",
    prompt_token_ids=list(range(1000, 1020)),
    sampling_params=sampling_pb2.SamplingParams(max_tokens=2),
    kv_target=kv_transfer_pb2.KVTarget(
        transfer_id="fuzz-t",
        backend=kv_transfer_pb2.TRANSFER_BACKEND_TCP,
        endpoint="127.0.0.1:1",
        block_ids=[0, 1],
        layout=LAYOUT,
    ),
)
PREFILL_VALUES: dict[str, list[Any]] = {
    **{f"sampling_params.{name}": values for name, values in SAMPLING.items()},
    "prompt_token_ids": [[], [U32], [1] * 9000, [1] * 40],
    "kv_target.transfer_id": ["", "x" * 300, "fuzz-2"],
    "kv_target.backend": [0, 2, 3, 4, 99],
    "kv_target.endpoint": ["", "nowhere", "127.0.0.1:0", "[::1]:99999"],
    "kv_target.block_ids": [[], [U32, U32], [0] * 500],
    "kv_target.layout.block_size": [0, 7, U32],
    "cache_salt": ["", "s"],
}
RESERVE_VALUES: dict[str, list[Any]] = {
    "request_id": ["", "r", "x" * 300],
    "num_prompt_tokens": [0, 1, 100, 8192, U32],
    "max_tokens": [0, 1, 8192, U32],
}
DECODE_VALUES: dict[str, list[Any]] = {
    **{f"start.sampling_params.{name}": values for name, values in SAMPLING.items()},
    "start.key": [0, 2**64 - 1],
    "start.transfer_id": ["", "unknown", "x" * 300],
    "start.prompt_token_ids": [[], [U32], [1] * 9000],
    "start.first_token_id": [0, U32],
    "cancel.key": [0, 1, 2**64 - 1],
}
DECODE_BASE = decode_pb2.DecodeStreamRequest(
    start=decode_pb2.DecodeStart(
        key=1, transfer_id="t", prompt_token_ids=[1, 2], sampling_params=sampling_pb2.SamplingParams(max_tokens=4)
    )
)
RELEASE_VALUES: dict[str, list[Any]] = {"transfer_id": ["", "unknown", "x" * 10_000]}


def _cases(seed: int, count: int, base: Any, values: dict[str, list[Any]]) -> list[FuzzCase]:
    """Three in four cases vary fields of `base`, one in four is random bytes."""
    rng = random.Random(seed)
    num_garbage = count // 4
    return structured_cases(rng, count - num_garbage, base, values) + random_garbage(rng, num_garbage)


def _fuzz(cluster: LocalCluster, num_router: int, num_pod: int) -> dict[str, Any]:
    """Every target's report; asserts the contract for each, then that nothing died and KV went back to idle."""
    pods = {p.role: p.address for p in cluster.pod_infos()}
    targets = [
        (
            "router Generate",
            cluster.router_address,
            "/pdserve.v1.GenerationService/Generate",
            True,
            _cases(1, num_router, GENERATE_BASE, GENERATE_VALUES),
            generation_pb2.GenerateRequest.DESCRIPTOR,
        ),
        (
            "prefill Prefill",
            pods["prefill"],
            "/pdserve.v1.PrefillService/Prefill",
            True,
            _cases(2, num_pod, PREFILL_BASE, PREFILL_VALUES),
            prefill_pb2.PrefillRequest.DESCRIPTOR,
        ),
        (
            "decode Reserve",
            pods["decode"],
            "/pdserve.v1.DecodeService/Reserve",
            False,
            _cases(3, num_pod, decode_pb2.ReserveRequest(num_prompt_tokens=20, max_tokens=2), RESERVE_VALUES),
            decode_pb2.ReserveRequest.DESCRIPTOR,
        ),
        (
            "decode Release",
            pods["decode"],
            "/pdserve.v1.DecodeService/Release",
            False,
            _cases(5, num_pod, decode_pb2.ReleaseRequest(transfer_id="t"), RELEASE_VALUES),
            decode_pb2.ReleaseRequest.DESCRIPTOR,
        ),
    ]
    figures: dict[str, Any] = {}
    for name, address, method, streaming, cases, descriptor in targets:
        started = time.monotonic()
        report = send_all(address, method, streaming, cases, descriptor)
        seconds = time.monotonic() - started
        assert report.bad == [], f"{name}: {len(report.bad)} bad answers, first: {report.bad[:5]}"
        figures[name] = {
            "cases": len(cases),
            "s": round(seconds, 1),
            "codes": dict(report.codes),
            "fields": len(report.fields),
        }
    started = time.monotonic()
    report = send_all_frames(
        pods["decode"],
        "/pdserve.v1.DecodeService/DecodeStream",
        _cases(4, num_pod, DECODE_BASE, DECODE_VALUES),
        decode_pb2.DecodeStreamRequest.DESCRIPTOR,
        decode_pb2.DecodeStart.DESCRIPTOR,
    )
    assert report.bad == [], f"decode DecodeStream: {len(report.bad)} bad answers, first: {report.bad[:5]}"
    seconds = time.monotonic() - started
    figures["decode DecodeStream"] = {
        "cases": num_pod,
        "s": round(seconds, 1),
        "codes": dict(report.codes),
        "fields": len(report.fields),
    }
    exited = cluster.poll_exited()
    assert exited is None, f"{exited.name} exited with {exited.returncode}:\n{exited.log_tail()}"
    assert log_errors(cluster) == {}
    started = time.monotonic()
    assert wait_until(lambda: kv_at_baseline(cluster), KV_BASELINE_TIMEOUT_S), cluster.pod_infos()
    figures["kv_back_to_baseline_s"] = round(time.monotonic() - started, 1)
    with GenerationClient(cluster.router_address) as client:
        assert answers_paris(client) == PARIS
    print(json.dumps(figures))
    return figures


@pytest.mark.slow
def test_fuzz_answers_no_internal_error_and_every_invalid_argument_names_its_field(input_cluster: LocalCluster) -> None:
    figures = _fuzz(input_cluster, NUM_ROUTER_CASES, NUM_POD_CASES)
    assert figures["router Generate"]["codes"].get("INVALID_ARGUMENT", 0) > NUM_ROUTER_CASES // 2


@pytest.mark.soak
def test_fuzz_soak_of_two_thousand_cases(input_cluster: LocalCluster) -> None:
    _fuzz(input_cluster, 2000, 200)


@pytest.mark.slow
def test_a_message_over_the_transport_limit_is_refused_naming_the_limit(input_cluster: LocalCluster) -> None:
    # NOTE: a channel without a send limit, so that the server is the one refusing.
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(input_cluster.router_address, options=options) as channel:
        call = channel.unary_stream("/pdserve.v1.GenerationService/Generate")
        request = generation_pb2.GenerateRequest(text="x" * (17 * 1024 * 1024)).SerializeToString()
        with pytest.raises(grpc.RpcError) as raised:
            list(call(request, timeout=60.0))
    error = raised.value
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"vs. {16 * 1024 * 1024}" in error.details()
    with GenerationClient(input_cluster.router_address) as client:
        assert answers_paris(client) == PARIS
