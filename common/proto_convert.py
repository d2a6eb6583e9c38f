"""Protobuf <-> plain values every service shares: sampling params, finish and stop reasons, durations."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from google.protobuf import duration_pb2

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from pdserve.v1 import sampling_pb2

FinishReason = Literal["stop", "length", "abort"]
StopReason = str | int | None
"""The stop string (str) or the stop / EOS token id (int) that ended a completion."""

_FINISH_TO_PB: dict[str, sampling_pb2.FinishReason.ValueType] = {
    "stop": sampling_pb2.FINISH_REASON_STOP,
    "length": sampling_pb2.FINISH_REASON_LENGTH,
    "abort": sampling_pb2.FINISH_REASON_ABORT,
}
_FINISH_FROM_PB: dict[sampling_pb2.FinishReason.ValueType, FinishReason] = {
    sampling_pb2.FINISH_REASON_STOP: "stop",
    sampling_pb2.FINISH_REASON_LENGTH: "length",
    sampling_pb2.FINISH_REASON_ABORT: "abort",
}
_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))
_EARLY_STOPPING_FROM_PB: dict[str, bool | str] = {"": False, "false": False, "true": True, "never": "never"}


def sampling_params_from_pb(pb: sampling_pb2.SamplingParams, max_n: int | None = None) -> SamplingParams:
    """The engine's SamplingParams; unset optional fields take the engine defaults. `max_n`: refuse a larger `n`
    (a pod computes one sample, or one beam search; the router fans n > 1 out).

    Raises InvalidArgumentError naming the public field (`sampling_params.<name>`; `n` for `max_n`).
    """
    if max_n is not None and pb.HasField("n") and not pb.use_beam_search and not 1 <= pb.n <= max_n:
        raise InvalidArgumentError("n", f"must be unset or in [1, {max_n}] (the router fans n > 1 out), got {pb.n}")
    # NOTE: fields left at their proto default are the engine's defaults too (proto3 `optional` marks
    # the others), so only the fields that are set matter; SamplingParams freezes repeated ones.
    values: dict[str, Any] = {field.name: value for field, value in pb.ListFields() if field.name in _SAMPLING_FIELDS}
    if "early_stopping" in values:
        early_stopping = _EARLY_STOPPING_FROM_PB.get(values["early_stopping"])
        if early_stopping is None:
            raise InvalidArgumentError(
                "sampling_params.early_stopping", f"must be true, false or never, got {values['early_stopping']!r}"
            )
        values["early_stopping"] = early_stopping
    try:
        return SamplingParams(**values)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"sampling_params.{exc.field}", exc.description) from None


def sampling_params_to_pb(params: SamplingParams) -> sampling_pb2.SamplingParams:
    """The wire form of `params`; every field is written explicitly (seed only when set)."""
    values = {name: getattr(params, name) for name in _SAMPLING_FIELDS}
    for name in ("seed", "best_of"):
        if values[name] is None:
            del values[name]
    early_stopping = values["early_stopping"]
    values["early_stopping"] = early_stopping if isinstance(early_stopping, str) else str(early_stopping).lower()
    return sampling_pb2.SamplingParams(**values)


def finish_reason_to_pb(reason: str | None) -> sampling_pb2.FinishReason.ValueType:
    """`reason` is a FinishReason (the engine reports it as a plain str)."""
    return sampling_pb2.FINISH_REASON_UNSPECIFIED if reason is None else _FINISH_TO_PB[reason]


def finish_reason_from_pb(value: sampling_pb2.FinishReason.ValueType) -> FinishReason | None:
    return _FINISH_FROM_PB.get(value)


def stop_reason_to_pb(reason: StopReason) -> sampling_pb2.StopReason | None:
    if reason is None:
        return None
    if isinstance(reason, str):
        return sampling_pb2.StopReason(stop_str=reason)
    return sampling_pb2.StopReason(stop_token_id=reason)


def stop_reason_from_pb(pb: sampling_pb2.StopReason) -> StopReason:
    which = pb.WhichOneof("reason")
    if which == "stop_str":
        return pb.stop_str
    if which == "stop_token_id":
        return pb.stop_token_id
    return None


def duration_to_pb(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration
