"""The fp8 kernels compiled for Hopper (sm90) on the CPU: no GPU is needed to run Triton's compiler to PTX.

The interpreter runs a kernel's Python, not its compilation: an fp8 KV helper with a return inside a constexpr
branch passed there and failed to compile on the H100 (the compiler types every return statement). And the PTX
shows what the GPU would do per loop step (here: no shared-memory round trip in the FP8 GEMV's K loop).
"""

from __future__ import annotations

from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.attention.triton_decode import _decode_kernel
from engine.attention.triton_prefill import _prefill_kernel
from engine.layers.triton_fp8_linear import _fp8_gemv_kernel, default_tiles
from engine.layers.triton_rope import _qk_norm_rope_store_kernel

HOPPER = GPUTarget("cuda", 90, 32)
# NOTE: argument types by name; every other pointer is the model dtype's, other scalars are int32.
POINTERS = {
    "cache_ptr": "*fp8e4nv",
    "w_ptr": "*fp8e4nv",
    "query_start_loc_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "block_table_ptr": "*i32",
    "part_out_ptr": "*fp32",
    "part_lse_ptr": "*fp32",
    "slot_mapping_ptr": "*i64",
    "positions_ptr": "*i64",
    "cos_sin_ptr": "*fp32",
    "scale_ptr": "*fp32",
}
FLOATS = {"qk_scale", "k_scale", "v_scale", "eps"}


def compile_for_hopper(kernel: Any, constexprs: dict[str, Any], num_warps: int = 4) -> str:
    """The kernel's PTX for sm90 under bf16 activations and an fp8 KV pool, every pointer and int argument
    16-aligned (as the launcher specializes them for the engine's tensors)."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = POINTERS.get(name, "*bf16")
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
    aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t[0] == "*" or t == "i32"}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
    return str(triton.compile(source, target=HOPPER, options={"num_warps": num_warps}).asm["ptx"])


def test_fp8_kv_attention_and_cache_writer_compile_for_hopper() -> None:
    head = {"HEAD_DIM": 128, "PAGE": 16, "DOT_PRECISION": "tf32", "KV_FP8": True}
    for block_n in (64, 256):
        decode = {"GROUP": 4, "BLOCK_G": 16, "BLOCK_N": block_n, "SPLIT": True, "FP8_ASM": True, "PDL": False, **head}
        ptx = compile_for_hopper(_decode_kernel, decode)
        # NOTE: V's fp8 -> float16 conversion comes before its shuffle into the dot operand layout (no byte loads).
        assert "cvt.rn.f16x2.e4m3x2" in ptx and "ld.shared.b8" not in ptx and "ld.shared.u8" not in ptx
    prefill = {"GROUP": 4, "GROUP_PAD": 4, "BLOCK_M": 64, "BLOCK_Q": 16, "BLOCK_N": 64, **head}
    compile_for_hopper(_prefill_kernel, prefill)
    rope = {"NUM_HEADS": 32, "NUM_KV_HEADS": 8, "BLOCK_HQ": 32, "BLOCK_HKV": 8, "HEAD_DIM": 128, "PAGE": 16}
    compile_for_hopper(_qk_norm_rope_store_kernel, {**rope, "HAS_NORM": True, "KV_FP8": True, "PDL": False})


def test_fp8_gemv_k_loop_has_no_barrier() -> None:
    tiles = default_tiles(24576, 4096)
    assert tiles is not None
    # NOTE: the gated GEMV (SwiGLU after the loop) has the same loop.
    for pdl, gated in ((False, False), (True, False), (False, True)):
        constexprs = {
            "HAS_BIAS": False,
            "BLOCK_N": tiles.block_n,
            "BLOCK_K": tiles.block_k,
            "UNROLL": 1,
            "VEC": 8,
            "PDL": pdl,
            "GATED": gated,
        }
        ptx = compile_for_hopper(_fp8_gemv_kernel, constexprs, tiles.num_warps)
        loop = ptx[ptx.index("Inner Loop Header") :]
        loop = loop[: loop.index("bra")]
        assert "ld.global" in loop and "bar.sync" not in loop and "ld.shared" not in loop
        # NOTE: with PDL, one weight load before the wait for the previous kernel, the first x load after it.
        prologue = ptx[: ptx.index("Inner Loop Header")]
        assert ("griddepcontrol.wait" in prologue) == pdl and "griddepcontrol" not in loop
        if pdl:
            wait = prologue.index("griddepcontrol.wait")
            assert prologue[:wait].count("ld.global") == 1 and "ld.global" in prologue[wait:]
