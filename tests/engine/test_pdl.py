"""Programmatic dependent launch (engine.layers.pdl): the kernels before a decoder layer's GEMVs signal their
successor at their start, and launched early (around GEMVs that are) wait for their predecessor before their first
load (sm90 PTX, compiled on the CPU); nothing asks for it off Hopper, and a model chooses it by its GEMVs."""

from __future__ import annotations

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend
from engine.attention.triton_decode import _decode_kernel, _reduce_kernel, decode_attention
from engine.layers.linear import LinearMethod
from engine.layers.pdl import pdl_supported
from engine.layers.quant.fp8 import Fp8LinearMethod
from engine.layers.quant.int4 import Int4LinearMethod
from engine.layers.quant.unquantized import UnquantizedLinearMethod
from engine.layers.triton_activation import _silu_and_mul_kernel
from engine.layers.triton_rms_norm import _rms_norm_kernel, fused_add_rms_norm, rms_norm
from engine.layers.triton_rope import _qk_norm_rope_store_kernel, qk_norm_rope_store
from tests.engine.test_fp8_sm90_compile import compile_for_hopper
from tests.engine.test_triton_attention import LAYER, make_batch
from tests.engine.triton_layer_checks import EPS, make_rope_case


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


ROPE = {"NUM_HEADS": 32, "NUM_KV_HEADS": 8, "BLOCK_HQ": 32, "BLOCK_HKV": 8, "HEAD_DIM": 128, "PAGE": 16}
DECODE = {"GROUP": 4, "BLOCK_G": 16, "HEAD_DIM": 128, "PAGE": 16, "BLOCK_N": 64, "SPLIT": True}


@pytest.mark.parametrize(
    ("kernel", "constexprs", "flag"),
    [
        (_rms_norm_kernel, {"HAS_RESIDUAL": True, "BLOCK": 4096, "PDL_TRIGGER": True}, "PDL_WAIT"),
        (_qk_norm_rope_store_kernel, {**ROPE, "HAS_NORM": True, "KV_FP8": False}, "PDL"),
        (_decode_kernel, {**DECODE, "DOT_PRECISION": "tf32", "KV_FP8": True, "FP8_ASM": True}, "PDL"),
        (_reduce_kernel, {"HEAD_DIM": 128, "BLOCK_S": 32}, "PDL"),
    ],
    ids=["rms_norm", "qk_norm_rope_store", "decode", "decode_reduce"],
)
def test_kernels_launched_early_wait_before_their_first_load(
    kernel: object, constexprs: dict[str, object], flag: str
) -> None:
    ptx = compile_for_hopper(kernel, {**constexprs, flag: True})
    assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
    assert "griddepcontrol.wait" not in compile_for_hopper(kernel, {**constexprs, flag: False})


def test_a_model_launches_its_small_kernels_early_where_its_gemvs_do() -> None:
    assert Int4LinearMethod.gemv_pdl and not LinearMethod.gemv_pdl
    assert not UnquantizedLinearMethod.gemv_pdl and not Fp8LinearMethod.gemv_pdl
    backend = TritonAttentionBackend(16, 0.1)
    assert not backend.pdl and backend.with_pdl().pdl and backend.with_pdl().block_size == 16
    torch_backend = TorchAttentionBackend(16, 0.1)
    assert torch_backend.with_pdl() is torch_backend


def test_no_pdl_off_cuda() -> None:
    assert not pdl_supported(torch.device("cpu"))


@pytest.mark.gpu
def test_kernels_launched_early_give_the_same_results() -> None:
    """Each kernel that can launch early gives bit for bit what its plain launch gives (each after a kernel that
    writes its input, as in a layer)."""
    gen = torch.Generator("cuda").manual_seed(0)
    x, residual, weight = (torch.randn(3, 4096, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    weight = weight[0]
    assert torch.equal(rms_norm(x * 2, weight, EPS, pdl=True), rms_norm(x * 2, weight, EPS))
    early, plain = (fused_add_rms_norm(x * 2, residual, weight, EPS, pdl=pdl) for pdl in (True, False))
    assert all(torch.equal(a, b) for a, b in zip(early, plain, strict=True))

    case = make_rope_case(8, (32, 8, 128), True, torch.bfloat16, "cuda", seed=1)
    pools = [case.pool[:, LAYER].clone() for _ in range(2)]
    args = (case.positions, case.cos_sin_cache, case.q_norm_weight, case.k_norm_weight, EPS)
    queries = [
        qk_norm_rope_store(case.qkv * 1, *args, pool, case.slot_mapping, *case.heads, pdl=pdl)
        for pool, pdl in zip(pools, (True, False), strict=True)
    ]
    assert torch.equal(queries[0], queries[1]) and torch.equal(pools[0], pools[1])

    batch = make_batch([(40, 1), (300, 1), (7, 1)], (32, 8, 128), torch.bfloat16, "cuda", seed=2)
    m, kv_cache = batch.metadata, batch.pool[:, LAYER]
    outputs = [torch.full_like(batch.query, float("nan")) for _ in range(2)]
    for output, pdl in zip(outputs, (True, False), strict=True):
        inputs = (batch.query * 1, kv_cache, m.query_start_loc, m.seq_lens, m.block_table, output, 0.1, 4)
        decode_attention(*inputs, pdl=pdl)
    assert torch.equal(outputs[0], outputs[1]) and not bool(outputs[0].isnan().any())
