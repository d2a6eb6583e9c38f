"""Programmatic dependent launch (engine.layers.pdl): the kernels before a decoder layer's GEMVs signal their
successor at their start, and the small PDL-launched kernels wait before they write, return or read more than the
inputs no kernel writes (sm90 PTX, compiled on the CPU); nothing asks for it off Hopper."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from engine.attention.triton_decode import _decode_kernel, _reduce_kernel
from engine.layers.pdl import TABLE_PATH, pdl_launches, pdl_supported
from engine.layers.triton_activation import _silu_and_mul_kernel
from engine.layers.triton_gemv import _gemv_kernel
from engine.layers.triton_rms_norm import _rms_norm_kernel
from engine.layers.triton_rope import _qk_norm_rope_store_kernel
from tests.engine.test_fp8_sm90_compile import compile_for_hopper

HEAD = {"HEAD_DIM": 128, "PAGE": 16}
ROPE = {"NUM_HEADS": 32, "NUM_KV_HEADS": 8, "BLOCK_HQ": 32, "BLOCK_HKV": 8, "HAS_NORM": True, "KV_FP8": True, **HEAD}
DECODE = {"GROUP": 4, "BLOCK_G": 16, "BLOCK_N": 64, "SPLIT": True, "FP8_ASM": True, "DOT_PRECISION": "tf32",
          "KV_FP8": True, **HEAD}  # fmt: skip
# NOTE: (kernel, constexprs, PDL switch, global loads allowed before the wait: the inputs no kernel of the step
# writes): RMSNorm's weight (4 x 16 bytes per thread), the request's query bounds and length, RoPE's position and
# cos/sin row, the GEMV's first weight tile.
PDL_KERNELS = [
    (_rms_norm_kernel, {"HAS_RESIDUAL": True, "BLOCK": 4096, "PDL_TRIGGER": True}, "PDL_WAIT", 4),
    (_qk_norm_rope_store_kernel, ROPE, "PDL", 7),
    (_decode_kernel, DECODE, "PDL", 3),
    (_reduce_kernel, {"HEAD_DIM": 128, "BLOCK_S": 32}, "PDL", 3),
    (_gemv_kernel, {"HAS_BIAS": False, "BLOCK_N": 8, "BLOCK_K": 512}, "PDL", 8),
]


@pytest.mark.parametrize(
    ("kernel", "constexprs"),
    [
        (_rms_norm_kernel, {"HAS_RESIDUAL": True, "BLOCK": 4096, "PDL_WAIT": False}),
        (_silu_and_mul_kernel, {"BLOCK": 1024}),
    ],
    ids=["rms_norm", "silu_and_mul"],
)
def test_kernels_before_the_gemvs_signal_their_successor_first(kernel: object, constexprs: dict[str, object]) -> None:
    ptx = compile_for_hopper(kernel, {**constexprs, "PDL_TRIGGER": True})
    assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("ld.global")
    assert "griddepcontrol" not in compile_for_hopper(kernel, {**constexprs, "PDL_TRIGGER": False})


def test_no_pdl_off_cuda() -> None:
    assert not pdl_supported(torch.device("cpu"))


@pytest.mark.parametrize(("kernel", "constexprs", "switch", "max_early_loads"), PDL_KERNELS,
                         ids=["rms_norm", "qk_norm_rope_store", "decode", "reduce", "gemv"])  # fmt: skip
def test_pdl_launched_kernels_wait_before_writing_or_returning(
    kernel: object, constexprs: dict[str, object], switch: str, max_early_loads: int
) -> None:
    ptx = compile_for_hopper(kernel, {**constexprs, switch: True})
    wait = ptx.index("griddepcontrol.wait")
    before = ptx[:wait]
    assert "griddepcontrol.launch_dependents" in before
    assert not re.search(r"st\.global|atom\.|red\.|\bret;", before)
    assert 0 < len(re.findall(r"ld\.global", before)) <= max_early_loads
    assert "griddepcontrol.wait" not in compile_for_hopper(kernel, {**constexprs, switch: False})


def test_pdl_table_names_known_kernels(tmp_path: Path) -> None:
    table = json.loads(TABLE_PATH.read_text())
    assert set(table) == {"rms_norm", "qk_norm_rope_store", "decode_attention", "gemv"}
    path = tmp_path / "pdl.json"
    path.write_text(json.dumps({"rms_norm": True, "decode_attention": False}))
    assert pdl_launches(path) == frozenset({"rms_norm"})
    assert pdl_launches(tmp_path / "missing.json") == frozenset()
