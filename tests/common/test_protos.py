"""The .proto contracts: documented, buf STANDARD names, generated code current, messages round-trip."""

from __future__ import annotations

import importlib
import importlib.resources
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.rpc import status_pb2
from grpc_tools import protoc  # type: ignore[import-untyped]

from pdserve.v1 import generation_pb2, sampling_pb2

PROTO_ROOT = Path(__file__).resolve().parents[2] / "protos"
PROTO_FILES = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "pdserve" / "v1").glob("*.proto"))

# Field numbers of the descriptor.proto fields that make up a SourceCodeInfo location path.
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 4, 5, 6
_MESSAGE_FIELD, _MESSAGE_NESTED, _MESSAGE_ENUM, _MESSAGE_ONEOF = 2, 3, 4, 8
_ENUM_VALUE, _SERVICE_METHOD = 2, 2

Element = tuple[str, tuple[int, ...]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[descriptor_pb2.FileDescriptorProto]:
    """Our .proto files, compiled by protoc with their comments (source info)."""
    out = tmp_path_factory.mktemp("protos") / "descriptors.pb"
    include = importlib.resources.files("grpc_tools") / "_proto"
    googleapis = Path(status_pb2.__file__).parents[2]  # NOTE: google/rpc/status.proto, which decode.proto imports
    includes = [f"-I{PROTO_ROOT}", f"-I{include}", f"-I{googleapis}"]
    args = ["protoc", *includes, "--include_source_info", f"--descriptor_set_out={out}"]
    assert protoc.main([*args, *PROTO_FILES]) == 0
    return list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)


def _message_elements(message: descriptor_pb2.DescriptorProto, name: str, path: tuple[int, ...]) -> Iterator[Element]:
    yield name, path
    for i, field in enumerate(message.field):
        yield f"{name}.{field.name}", (*path, _MESSAGE_FIELD, i)
    for i, oneof in enumerate(message.oneof_decl):
        if not oneof.name.startswith("_"):  # proto3 `optional` makes synthetic oneofs named _<field>.
            yield f"{name}.{oneof.name}", (*path, _MESSAGE_ONEOF, i)
    for i, nested in enumerate(message.nested_type):
        if not nested.options.map_entry:  # a map field makes a synthetic <Field>Entry message
            yield from _message_elements(nested, f"{name}.{nested.name}", (*path, _MESSAGE_NESTED, i))
    for i, enum in enumerate(message.enum_type):
        yield from _enum_elements(enum, f"{name}.{enum.name}", (*path, _MESSAGE_ENUM, i))


def _enum_elements(enum: descriptor_pb2.EnumDescriptorProto, name: str, path: tuple[int, ...]) -> Iterator[Element]:
    yield name, path
    for i, value in enumerate(enum.value):
        yield f"{name}.{value.name}", (*path, _ENUM_VALUE, i)


def _elements(file: descriptor_pb2.FileDescriptorProto) -> Iterator[Element]:
    """(name, source path) of every message, field, oneof, enum, enum value, service and rpc."""
    for i, message in enumerate(file.message_type):
        yield from _message_elements(message, message.name, (_FILE_MESSAGE, i))
    for i, enum in enumerate(file.enum_type):
        yield from _enum_elements(enum, enum.name, (_FILE_ENUM, i))
    for i, service in enumerate(file.service):
        yield service.name, (_FILE_SERVICE, i)
        for j, method in enumerate(service.method):
            yield f"{service.name}.{method.name}", (_FILE_SERVICE, i, _SERVICE_METHOD, j)


def _all_messages(file: descriptor_pb2.FileDescriptorProto) -> Iterator[descriptor_pb2.DescriptorProto]:
    messages = list(file.message_type)
    while messages:
        message = messages.pop()
        yield message
        messages.extend(message.nested_type)


def _all_enums(file: descriptor_pb2.FileDescriptorProto) -> Iterator[descriptor_pb2.EnumDescriptorProto]:
    yield from file.enum_type
    for message in _all_messages(file):
        yield from message.enum_type


def test_proto_files_are_the_expected_ones() -> None:
    expected = ["decode", "generation", "kv_transfer", "prefill", "sampling"]
    assert [f"pdserve/v1/{name}.proto" for name in expected] == PROTO_FILES


def test_every_element_has_a_leading_comment(files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    undocumented = []
    checked = set()
    for file in files:
        comments = {tuple(loc.path): loc.leading_comments.strip() for loc in file.source_code_info.location}
        for name, path in _elements(file):
            checked.add(name)
            if not comments.get(path):
                undocumented.append(f"{file.name}: {name}")
    assert undocumented == []
    one_of_each_kind = {
        "SamplingParams",
        "SamplingParams.temperature",
        "GenerateRequest.input",
        "FinishReason",
        "FinishReason.FINISH_REASON_STOP",
        "GenerationService",
        "GenerationService.Generate",
    }
    assert one_of_each_kind <= checked


def test_package_and_files_follow_buf_standard(files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    for file in files:
        assert file.package == "pdserve.v1"
        assert file.syntax == "proto3"
        assert re.fullmatch(r"pdserve/v1/[a-z][a-z0-9_]*\.proto", file.name)


def test_enum_values_are_prefixed_and_zero_is_unspecified(files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    enums = [enum for file in files for enum in _all_enums(file)]
    assert sorted(enum.name for enum in enums) == ["AbortResult", "FinishReason", "ServerState", "TransferBackend"]
    for enum in enums:
        prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
        assert enum.value[0].number == 0
        assert enum.value[0].name == f"{prefix}UNSPECIFIED"
        assert all(value.name.startswith(prefix) for value in enum.value)


def test_services_and_rpcs_follow_buf_standard(files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    rpcs = {}
    for file in files:
        for service in file.service:
            assert service.name.endswith("Service")
            for method in service.method:
                rpcs[f"{service.name}.{method.name}"] = (method.input_type, method.output_type)
    assert sorted(rpcs) == [
        "DecodeService.DecodeStream",
        "DecodeService.Release",
        "DecodeService.Reserve",
        "GenerationService.Abort",
        "GenerationService.Generate",
        "GenerationService.GetLoad",
        "GenerationService.GetModelInfo",
        "GenerationService.GetServerInfo",
        "GenerationService.Tokenize",
        "PrefillService.Prefill",
    ]
    for name, (input_type, output_type) in rpcs.items():
        rpc = name.split(".")[1]
        assert (input_type, output_type) == (f".pdserve.v1.{rpc}Request", f".pdserve.v1.{rpc}Response")


def test_server_streaming_rpcs_are_exactly_the_streaming_ones(
    files: list[descriptor_pb2.FileDescriptorProto],
) -> None:
    streaming = {
        method.name: (method.client_streaming, method.server_streaming)
        for file in files
        for service in file.service
        for method in service.method
    }
    assert streaming == {
        "Generate": (False, True),
        "GetModelInfo": (False, False),
        "Tokenize": (False, False),
        "Abort": (False, False),
        "GetServerInfo": (False, False),
        "GetLoad": (False, False),
        "Prefill": (False, True),
        "Reserve": (False, False),
        "DecodeStream": (True, True),
        "Release": (False, False),
    }


def test_generated_code_matches_the_proto_sources(files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    for file in files:
        module = importlib.import_module(file.name.removesuffix(".proto").replace("/", ".") + "_pb2")
        generated = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        source = descriptor_pb2.FileDescriptorProto()
        source.CopyFrom(file)
        source.ClearField("source_code_info")
        for message in _all_messages(source):
            for field in message.field:
                field.ClearField("json_name")  # the Python generator leaves the default JSON names out.
        assert generated == source, f"{file.name} changed since generation: run scripts/gen_protos.sh"


def test_stubs_were_generated_for_grpcio_1_84(files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    for file in files:
        grpc_module = importlib.import_module(file.name.removesuffix(".proto").replace("/", ".") + "_pb2_grpc")
        assert grpc_module.GRPC_GENERATED_VERSION == "1.84.0"


def test_sampling_fields_with_engine_defaults_other_than_zero_are_optional() -> None:
    fields = sampling_pb2.SamplingParams.DESCRIPTOR.fields
    optional = sorted(f.name for f in fields if f.has_presence)
    assert optional == [
        "best_of",
        "length_penalty",
        "max_tokens",
        "n",
        "repetition_penalty",
        "seed",
        "temperature",
        "top_k",
        "top_p",
    ]
    params = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=8)
    assert [field.name for field, _ in params.ListFields()] == ["temperature", "max_tokens"]


def test_generate_request_round_trip() -> None:
    request = generation_pb2.GenerateRequest(
        messages=generation_pb2.ChatMessages(
            messages=[
                generation_pb2.ChatMessage(role="system", content="Be brief."),
                generation_pb2.ChatMessage(role="user", content="Héllo ✓"),
            ]
        ),
        sampling_params=sampling_pb2.SamplingParams(
            n=2, temperature=0.7, top_k=50, seed=-3, stop=["\n\n", "END"], stop_token_ids=[2, 7], logprobs=True
        ),
        request_id="req-1",
        cache_salt="tenant-a",
    )
    wire = request.SerializeToString()
    decoded = generation_pb2.GenerateRequest.FromString(wire)

    assert decoded == request
    assert decoded.WhichOneof("input") == "messages"
    assert [(m.role, m.content) for m in decoded.messages.messages] == [("system", "Be brief."), ("user", "Héllo ✓")]
    params = decoded.sampling_params
    assert (params.n, params.temperature, params.top_k, params.seed) == (2, 0.7, 50, -3)
    assert (list(params.stop), list(params.stop_token_ids), params.logprobs) == (["\n\n", "END"], [2, 7], True)
    assert not params.HasField("max_tokens")
    assert (decoded.request_id, decoded.cache_salt) == ("req-1", "tenant-a")

    decoded.token_ids.token_ids.extend([1, 2, 3])
    assert decoded.WhichOneof("input") == "token_ids"
    assert not decoded.HasField("messages")
