"""Protobuf <-> core values the pods share (pod.convert), and the pods' sampling params (one sample each)."""

from __future__ import annotations

import pytest

from common.errors import InvalidArgumentError
from common.proto_convert import sampling_params_from_pb as common_sampling_params_from_pb
from common.sampling_params import SamplingParams
from kv_transfer.config import BACKENDS
from kv_transfer.layout import KVLayout
from kv_transfer.target import KVTarget
from pdserve.v1 import kv_transfer_pb2, sampling_pb2
from pod.convert import (
    backend_from_pb,
    backend_to_pb,
    kv_layout_from_pb,
    kv_layout_to_pb,
    kv_target_from_pb,
    kv_target_to_pb,
)


def sampling_params_from_pb(pb: sampling_pb2.SamplingParams) -> SamplingParams:
    """As the pods' servicers convert their requests' sampling params."""
    return common_sampling_params_from_pb(pb, max_n=1)


LAYOUT = KVLayout("float32", 16, 2, 2, 32)


def test_unset_sampling_fields_take_the_engine_defaults() -> None:
    assert sampling_params_from_pb(sampling_pb2.SamplingParams()) == SamplingParams()


def test_sampling_fields_carry_over() -> None:
    pb = sampling_pb2.SamplingParams(
        n=1,
        temperature=0.0,
        top_k=5,
        top_p=0.5,
        min_p=0.25,
        seed=7,
        max_tokens=3,
        repetition_penalty=1.5,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        stop=["x"],
        stop_token_ids=[9],
        ignore_eos=True,
        logprobs=True,
        priority=2,
    )
    assert sampling_params_from_pb(pb) == SamplingParams(
        temperature=0.0,
        top_k=5,
        top_p=0.5,
        min_p=0.25,
        seed=7,
        max_tokens=3,
        repetition_penalty=1.5,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        stop=("x",),
        stop_token_ids=(9,),
        ignore_eos=True,
        logprobs=True,
        priority=2,
    )


def test_n_above_one_is_refused() -> None:
    with pytest.raises(InvalidArgumentError) as error:
        sampling_params_from_pb(sampling_pb2.SamplingParams(n=2))
    assert error.value.field == "n"


def test_layout_round_trip_and_bad_layouts() -> None:
    pb = kv_layout_to_pb(LAYOUT)
    assert pb.block_nbytes == 2 * 2 * 16 * 2 * 32 * 4
    assert kv_layout_from_pb(pb, "kv_target.layout") == LAYOUT
    pb.block_nbytes += 1
    with pytest.raises(InvalidArgumentError) as error:
        kv_layout_from_pb(pb, "kv_target.layout")
    assert error.value.field == "kv_target.layout.block_nbytes"
    with pytest.raises(InvalidArgumentError) as error:
        kv_layout_from_pb(kv_transfer_pb2.KVLayout(dtype="float32"), "kv_target.layout")
    assert error.value.field == "kv_target.layout.block_size"


def test_fp8_layout_scales_travel_and_unset_ones_read_as_one() -> None:
    fp8 = KVLayout("float8_e4m3fn", 16, 2, 2, 32, k_scale=0.1, v_scale=2.0)
    assert kv_layout_from_pb(kv_layout_to_pb(fp8), "kv_target.layout") == fp8
    pb = kv_layout_to_pb(fp8)
    pb.ClearField("k_scale")
    assert kv_layout_from_pb(pb, "kv_target.layout").k_scale == 1.0
    pb.v_scale = 0.0
    with pytest.raises(InvalidArgumentError) as error:
        kv_layout_from_pb(pb, "kv_target.layout")
    assert error.value.field == "kv_target.layout.v_scale"


def test_backend_names() -> None:
    for name in BACKENDS:  # every backend a decode pod can announce maps to the wire and back
        assert backend_from_pb(backend_to_pb(name), "f") == name
    assert backend_to_pb("cuda_ipc") == kv_transfer_pb2.TRANSFER_BACKEND_CUDA_IPC
    with pytest.raises(InvalidArgumentError) as error:
        backend_from_pb(kv_transfer_pb2.TRANSFER_BACKEND_UNSPECIFIED, "kv_target.backend")
    assert error.value.field == "kv_target.backend"


def test_kv_target_round_trip_keeps_the_reserving_pods_generation() -> None:
    target = KVTarget("t-1", "tcp", "127.0.0.1:9", (4, 5, 6), LAYOUT, 30.0, 1_764_000_000_123_456_789)
    pb = kv_target_to_pb(target)
    assert pb.generation == 1_764_000_000_123_456_789
    assert kv_target_from_pb(pb, "kv_target") == target
    pb.ClearField("generation")
    assert kv_target_from_pb(pb, "kv_target").generation == 0
