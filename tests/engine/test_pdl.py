"""Programmatic dependent launch (engine.layers.pdl): the kernels before a decoder layer's GEMVs signal their
successor at their start (sm90 PTX, compiled on the CPU), and nothing asks for it off Hopper."""

from __future__ import annotations

import pytest
import torch

from engine.layers.pdl import pdl_supported
from engine.layers.triton_activation import _silu_and_mul_kernel
from engine.layers.triton_rms_norm import _rms_norm_kernel
from tests.engine.test_fp8_sm90_compile import compile_for_hopper


@pytest.mark.parametrize(
    ("kernel", "constexprs"),
    [(_rms_norm_kernel, {"HAS_RESIDUAL": True, "BLOCK": 4096}), (_silu_and_mul_kernel, {"BLOCK": 1024})],
    ids=["rms_norm", "silu_and_mul"],
)
def test_kernels_before_the_gemvs_signal_their_successor_first(kernel: object, constexprs: dict[str, object]) -> None:
    ptx = compile_for_hopper(kernel, {**constexprs, "PDL_TRIGGER": True})
    assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("ld.global")
    assert "griddepcontrol" not in compile_for_hopper(kernel, {**constexprs, "PDL_TRIGGER": False})


def test_no_pdl_off_cuda() -> None:
    assert not pdl_supported(torch.device("cpu"))
