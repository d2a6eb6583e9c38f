"""Request messages that do not parse, reported as bad input instead of crashing the handler.

gRPC deserializes a request before any handler or interceptor code runs, and an exception there answers
UNKNOWN with a traceback in the log. `tolerant_deserializer` wraps a message's parser so that it never
raises: bytes that do not parse become an `UnparsedRequest` carrying an InvalidArgumentError, which the
error interceptor (`common.grpc.errors.ErrorInterceptor`) reports as INVALID_ARGUMENT. The error names the
first field whose bytes are bad (e.g. `messages.messages.content` for invalid UTF-8), found by walking the
wire format against the message's descriptor, or `request` when the bytes are not a message at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from common.errors import InvalidArgumentError

WHOLE_REQUEST = "request"
"""The field an error names when the bytes are no message at all."""

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


@dataclass(slots=True, frozen=True)
class UnparsedRequest:
    """What a tolerant deserializer returns for bytes that do not parse."""

    error: InvalidArgumentError


def tolerant_deserializer(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserialize` (a message class's FromString) that returns an UnparsedRequest instead of raising."""
    if deserialize is None:
        return None
    # NOTE: generated handlers pass `<Message>.FromString`, bound to the message class; any other parser still
    # gets its errors reported, naming the whole request.
    descriptor: Descriptor | None = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:
            field = _bad_field(data, descriptor) if descriptor is not None else None
            return UnparsedRequest(
                InvalidArgumentError(field or WHOLE_REQUEST, f"request message does not parse: {exc}")
            )

    return parse


def _bad_field(data: bytes, descriptor: Descriptor, prefix: str = "") -> str | None:
    """Dotted path of the first field whose bytes are bad; None when the fault is not in one field."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        if pos < 0:
            return None
        field = descriptor.fields_by_number.get(tag >> 3)
        path = f"{prefix}{field.name}" if field is not None else None
        wire_type = tag & 7
        if wire_type == _VARINT:
            _, pos = _varint(data, pos)
        elif wire_type in (_FIXED64, _FIXED32):
            pos += 8 if wire_type == _FIXED64 else 4
        elif wire_type == _LENGTH_DELIMITED:
            size, start = _varint(data, pos)
            pos = start + size
            if start < 0 or pos > len(data):
                return path
            bad = _bad_value(data[start:pos], field, f"{path}.") if field is not None else None
            if bad is not None:
                return bad
            continue
        else:
            return path
        if pos < 0 or pos > len(data):
            return path
    return None


def _bad_value(value: bytes, field: FieldDescriptor, prefix: str) -> str | None:
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return prefix[:-1]
        return None
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
        return _bad_field(value, field.message_type, prefix)
    return None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); position -1 when the varint runs past the end or past 10 bytes."""
    value = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return 0, -1
