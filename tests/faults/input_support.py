"""Helpers of the hostile-input, Redis and router-restart fault tests (their cluster: conftest.py's input_cluster):
the fuzz cases (request bytes) and how their answers are judged, and the " Paris." check that the cluster still
answers correctly."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2

from client.generation_client import GenerationClient
from common.grpc.errors import bad_request_fields
from common.grpc.server import message_size_options
from pdserve.v1 import decode_pb2
from tests.e2e.support import run

PARIS_PROMPT = "The capital of France is"
PARIS = " Paris."
"""SmolLM2-135M-Instruct's greedy 2-token answer to PARIS_PROMPT."""
CALL_TIMEOUT_S = 120.0
KV_LEASE_S = 5.0
"""The fault cluster's --kv-lease-s: reservations that valid fuzzed Reserve calls leave behind lapse with it."""
FAILURE_CODES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})


def answers_paris(client: GenerationClient) -> str:
    """The text of the greedy 2-token completion of PARIS_PROMPT (PARIS when the cluster is healthy)."""
    return run(client, prompt=PARIS_PROMPT, max_tokens=2, temperature=0.0).text


@dataclass(slots=True, frozen=True)
class FuzzCase:
    kind: str
    """What the case varies, e.g. "sampling_params.seed" or "garbage"."""
    data: bytes


@dataclass(slots=True)
class FuzzReport:
    """What the answers to a set of fuzz cases were."""

    codes: Counter[str] = field(default_factory=Counter)
    fields: Counter[str] = field(default_factory=Counter)
    """The field each INVALID_ARGUMENT named."""
    bad: list[str] = field(default_factory=list)
    """Answers that break the contract: INTERNAL/UNKNOWN, or an INVALID_ARGUMENT that names no real field."""


def length_delimited(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field on the wire."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def names_a_field(path: str, descriptor: Descriptor) -> bool:
    """`path` is "request" (the whole message) or a dotted path of fields of `descriptor`."""
    if path == "request":
        return True
    current: Descriptor | None = descriptor
    for name in path.split("."):
        if current is None or name not in current.fields_by_name:
            return False
        current = current.fields_by_name[name].message_type
    return True


def send_all(
    address: str, method: str, streaming: bool, cases: Sequence[FuzzCase], descriptor: Descriptor, workers: int = 4
) -> FuzzReport:
    """Send every case's bytes as the request of `method` (a full method path) and judge each answer."""
    report = FuzzReport()
    channel = grpc.insecure_channel(address, options=message_size_options())
    call: Callable[..., Any] = (channel.unary_stream if streaming else channel.unary_unary)(method)

    def one(case: FuzzCase) -> None:
        try:
            answer = call(case.data, timeout=CALL_TIMEOUT_S)
            if streaming:
                for _ in answer:
                    pass
            report.codes["OK"] += 1
        except grpc.RpcError as exc:
            _judge(report, case, cast(grpc.aio.AioRpcError, exc), descriptor)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, cases))
    finally:
        channel.close()
    return report


def send_all_frames(
    address: str,
    method: str,
    cases: Sequence[FuzzCase],
    frame_descriptor: Descriptor,
    item_descriptor: Descriptor,
    workers: int = 4,
) -> FuzzReport:
    """Send every case's bytes as the one frame of a DecodeStream-like call (`method`, bidirectional) and judge what
    comes back: each request end's error against `item_descriptor` (the frame's per-request part), the call's own
    status against `frame_descriptor`."""
    report = FuzzReport()
    channel = grpc.insecure_channel(address, options=message_size_options())
    call: Callable[..., Any] = channel.stream_stream(method)

    def one(case: FuzzCase) -> None:
        try:
            for data in call(iter([case.data]), timeout=CALL_TIMEOUT_S):
                for end in decode_pb2.DecodeStreamResponse.FromString(data).ends:
                    if end.HasField("error"):
                        _judge_status(report, case, end.error, item_descriptor)
                    else:
                        report.codes["OK"] += 1
        except grpc.RpcError as exc:
            _judge(report, case, cast(grpc.aio.AioRpcError, exc), frame_descriptor)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, cases))
    finally:
        channel.close()
    return report


def _judge(report: FuzzReport, case: FuzzCase, error: grpc.aio.AioRpcError, descriptor: Descriptor) -> None:
    code = error.code()
    report.codes[code.name] += 1
    if code in FAILURE_CODES:
        report.bad.append(f"{case.kind}: {code.name} {error.details()}")
    elif code is grpc.StatusCode.INVALID_ARGUMENT:
        paths = [path for path, _ in bad_request_fields(error)]
        report.fields.update(paths)
        if not paths or not all(names_a_field(path, descriptor) for path in paths):
            report.bad.append(f"{case.kind}: INVALID_ARGUMENT naming {paths}: {error.details()}")


def _judge_status(report: FuzzReport, case: FuzzCase, status: status_pb2.Status, descriptor: Descriptor) -> None:
    name = code_pb2.Code.Name(status.code)
    report.codes[name] += 1
    if status.code in (code_pb2.INTERNAL, code_pb2.UNKNOWN):
        report.bad.append(f"{case.kind}: {name} {status.message}")
    elif status.code == code_pb2.INVALID_ARGUMENT:
        paths = [path for path, _ in bad_request_fields(status)]
        report.fields.update(paths)
        if not paths or not all(names_a_field(path, descriptor) for path in paths):
            report.bad.append(f"{case.kind}: INVALID_ARGUMENT naming {paths}: {status.message}")


def random_garbage(rng: random.Random, count: int) -> list[FuzzCase]:
    """Random bytes (0 to 256 of them) as the request message."""
    return [FuzzCase("garbage", rng.randbytes(rng.randint(0, 256))) for _ in range(count)]


def structured_cases(
    rng: random.Random, count: int, base: Message, values: Mapping[str, Sequence[Any]]
) -> list[FuzzCase]:
    """`count` variants of `base`: 1 to 3 fields (dotted paths, keys of `values`) set to one of their values; one
    case in five also carries invalid UTF-8 in a random string field, one in twenty a field of the wrong wire type.
    """
    strings = _string_field_paths(base.DESCRIPTOR)
    cases = []
    for _ in range(count):
        message = type(base)()
        message.CopyFrom(base)
        paths = rng.sample(sorted(values), rng.randint(1, min(3, len(values))))
        for path in paths:
            _set(message, path, rng.choice(values[path]))
        data = message.SerializeToString()
        roll = rng.random()
        if roll < 0.2:
            numbers = rng.choice(strings)
            data += _nested(numbers, b"ok\xff\xfe\xc0")
            paths.append("bad-utf8")
        elif roll < 0.25:
            number = rng.choice(list(base.DESCRIPTOR.fields_by_number))
            data += _varint(number << 3 | rng.choice((0, 1, 5))) + rng.randbytes(8)
            paths.append("wire-type")
        cases.append(FuzzCase("+".join(paths), data))
    return cases


def _set(message: Message, path: str, value: Any) -> None:
    *parents, name = path.split(".")
    for parent in parents:
        message = getattr(message, parent)
    target = getattr(message, name)
    if isinstance(value, Message):
        target.CopyFrom(value)
        target.SetInParent()
    elif isinstance(value, list):
        del target[:]
        target.extend(value)
    else:
        setattr(message, name, value)


def _string_field_paths(descriptor: Descriptor, depth: int = 3) -> list[tuple[int, ...]]:
    """Field number paths of every string field, nested messages included (to `depth` levels)."""
    paths: list[tuple[int, ...]] = []
    for one in descriptor.fields:
        if one.type == FieldDescriptor.TYPE_STRING:
            paths.append((one.number,))
        elif one.message_type is not None and depth > 1:
            paths += [(one.number, *rest) for rest in _string_field_paths(one.message_type, depth - 1)]
    return paths


def _nested(numbers: tuple[int, ...], payload: bytes) -> bytes:
    for number in reversed(numbers):
        payload = length_delimited(number, payload)
    return payload
