"""The int4 kernels compiled for Hopper (sm90) on the CPU (Triton's compiler to PTX, no GPU): the interpreter runs
their Python, not their compilation, and the PTX shows what each GEMV loop step does."""

from __future__ import annotations

from typing import Any

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine.layers.quant.triton_int4 import _int4_gemv_kernel, _splitk_reduce_kernel  # noqa: E402
from engine.layers.quant.triton_int4_gemm import _int4_dequant_kernel, _int4_gemm_kernel  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
POINTERS = {"w_ptr": "*i32", "scale_ptr": "*fp16", "zero_ptr": "*u8", "perm_ptr": "*i32", "part_ptr": "*fp32"}


def compile_for_hopper(
    kernel: Any, constexprs: dict[str, Any], num_warps: int, out: str = "*bf16", act: str = "*bf16"
) -> Any:
    """The compiled kernel for sm90, `act` activations, every pointer and int argument 16-aligned."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = out if name == "out_ptr" else POINTERS.get(name, act)
        else:
            signature[name] = "i32"
    aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t[0] == "*" or t == "i32"}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
    return triton.compile(source, target=HOPPER, options={"num_warps": num_warps, "num_stages": 3})


def test_split_k_gemv_loop_streams_16_byte_words_without_barriers() -> None:
    """The float32 GEMV with split-K and programmatic dependent launch: the loop has no barrier or shared memory;
    the first weight tile is loaded before the wait for the previous kernel, x after it."""
    constexprs = {
        "HAS_PERM": False,
        "HAS_BIAS": False,
        "BLOCK_N": 16,
        "GROUPS": 4,
        "PARTIAL": True,
        "HALF2": False,
        "MAGIC": 0,
        "ASM": True,
        "EVEN": False,
        "PDL": True,
        "GATED": False,
    }
    ptx = compile_for_hopper(_int4_gemv_kernel, constexprs, 4, out="*fp32").asm["ptx"]
    loop = ptx[ptx.index("$L__BB0_") :]
    loop = loop[: loop.rindex("bra")]
    assert "ld.global.v4" in loop and "bar.sync" not in loop and "ld.shared" not in loop
    prologue = ptx[: ptx.index("$L__BB0_")]
    wait = prologue.index("griddepcontrol.wait")
    assert "ld.global.v4" in prologue[:wait] and "ld.global" not in prologue[wait:] and "griddepcontrol" not in loop
    compile_for_hopper(_splitk_reduce_kernel, {"HAS_BIAS": True, "BLOCK": 1024}, 4)


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize(
    ("act", "magic", "packed_fma"), [("*bf16", 0x43004300, "fma.rn.bf16x2"), ("*fp16", 0x64006400, "fma.rn.f16x2")]
)
def test_half2_gemv_loop_does_packed_math_and_one_float_fma_per_two_words(
    act: str, magic: int, packed_fma: str, gated: bool
) -> None:
    """The packed half-precision GEMV's loop, act-order, 16 rows x 4 groups on 4 warps (8 words per thread): per
    word 8 packed FMAs (4 zero subtractions, 4 products), per two words one more (their sums added), one float add
    (the widening) and one float FMA (the group scale); no float multiply, no barrier or shared-memory load. The
    gated variant (SwiGLU after the loop) has the same loop."""
    constexprs = {
        "HAS_PERM": True,
        "HAS_BIAS": False,
        "BLOCK_N": 16,
        "GROUPS": 4,
        "PARTIAL": False,
        "HALF2": True,
        "MAGIC": magic,
        "ASM": True,
        "EVEN": True,
        "PDL": False,
        "GATED": gated,
    }
    ptx = compile_for_hopper(_int4_gemv_kernel, constexprs, 4, out=act, act=act).asm["ptx"]
    loop = ptx[ptx.index("$L__BB0_") :]
    loop = loop[: loop.rindex("bra")]
    words = 16 * 4 * 16 // 128
    assert loop.count(packed_fma) == 8 * words + words // 2 and loop.count("fma.rn.f32") == words // 2
    assert "mul.f32" not in loop and "bar.sync" not in loop and "ld.shared" not in loop


def test_gemm_uses_wgmma_and_dequant_compiles() -> None:
    constexprs = {
        "HAS_PERM": True,
        "HAS_BIAS": True,
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "GROUPS": 1,
        "GROUP_M": 8,
        "DOT_PRECISION": "tf32",
    }
    gemm = compile_for_hopper(_int4_gemm_kernel, constexprs, 8)
    assert "wgmma.mma_async" in gemm.asm["ptx"] and gemm.metadata.shared <= 228 * 1024
    compile_for_hopper(_int4_dequant_kernel, {"BLOCK_N": 16, "GROUPS": 4}, 4)
