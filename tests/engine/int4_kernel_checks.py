"""What the int4 kernels (engine.layers.quant.triton_int4) must satisfy, on any device: `x @ W^T + bias` where W is
the reference quantizer's dequantized weight (tests/engine/int4_reference.py), for GPTQ, GPTQ act-order and AWQ,
through the loader's repacking. `run_interpreted_checks` runs small CPU cases in Triton's interpreter; the GPU tests
run the real shapes.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from engine.attention.torch_backend import TorchAttentionBackend
from engine.layers.quant.int4 import Awq, Gptq, Int4Checkpoint
from engine.layers.quant.int4_layout import PackedInt4, dequantize, pack_kernel_order
from engine.layers.quant.int4_tuning import Int4Config
from engine.layers.quant.triton_int4 import int4_linear, int4_linear_silu_and_mul
from engine.layers.triton_activation import silu_and_mul
from engine.models.arch_config import ArchConfig
from engine.models.loader import build_model, checkpoint_tensors, load_weights, process_weights_after_loading
from tests.engine.int4_reference import Int4Format, quantization_config, quantize_projection, write_int4_checkpoint

FORMATS = {
    "gptq": Int4Format("gptq"),
    "gptq-act-order": Int4Format("gptq", act_order=True),
    "gptq_v2-asym-act-order": Int4Format("gptq", act_order=True, symmetric=False, checkpoint_format="gptq_v2"),
    "awq": Int4Format("awq", symmetric=False),
}
FLOAT32_TOLERANCE = 1e-5
"""Relative error (norm) of float32 outputs: only the summation order differs from the float64 reference."""
HALF_TOLERANCE = 1e-2
"""Relative error of bf16/fp16 outputs vs float64: activations and output rounded to 8 (bf16) bits."""
SMALL_QWEN3 = Qwen3Config(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
)


def make_case(name: str, n: int, k: int, device: str, seed: int) -> tuple[PackedInt4, torch.Tensor]:
    """(the repacked int4 weight [n, k] on `device`, the reference's dequantized float32 weight)."""
    fmt = FORMATS[name]
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    parts, dequantized = quantize_projection(weight, fmt, np.random.default_rng(seed))
    method: Int4Checkpoint = (Gptq if fmt.method == "gptq" else Awq)(quantization_config(fmt), packed=True)
    packed = method.repack(parts)
    moved = {f: getattr(packed, f).to(device) for f in ("weight", "scale", "zero")}
    perm = None if packed.perm is None else packed.perm.to(device)
    return replace(packed, **moved, perm=perm), dequantized.to(device)


def random_case(n: int, k: int, act_order: bool, device: str, seed: int) -> tuple[PackedInt4, torch.Tensor]:
    """Random nibbles, scales, zeros (0..15) and, with `act_order`, a random input permutation, packed on `device`
    (fast at the 8B shapes), with the weight they stand for (`dequantize`, checked exact on the CPU against the
    reference quantizer through `make_case`)."""
    gen = torch.Generator(device).manual_seed(seed)
    groups = k // 128
    q = torch.randint(0, 16, (n, k), generator=gen, device=device)
    scale = (torch.rand(n, groups, generator=gen, device=device) * 0.01 + 1e-3).half()
    zero = torch.randint(0, 16, (n, groups), generator=gen, device=device).to(torch.uint8)
    perm = torch.randperm(k, generator=gen, device=device).to(torch.int32) if act_order else None
    packed = PackedInt4(pack_kernel_order(q), scale, zero, perm)
    return packed, dequantize(packed)


def check_int4_linear(
    case: tuple[PackedInt4, torch.Tensor],
    m: int,
    dtype: torch.dtype,
    bias: bool,
    seed: int,
    config: Int4Config | None = None,
) -> None:
    packed, weight = case
    gen = torch.Generator(weight.device).manual_seed(seed)
    n, k = weight.shape
    # NOTE: rows of a wider buffer: the kernels must honour x's row stride.
    x = torch.randn(m, k + 8, generator=gen, device=weight.device).to(dtype)[:, :k]
    b = torch.randn(n, generator=gen, device=weight.device).to(dtype) if bias else None
    out = int4_linear(x, packed, b, config)
    want = x.double() @ weight.double().T + (0 if b is None else b.double())
    assert out.shape == (m, n) and out.dtype == dtype and bool(torch.isfinite(out).all())
    error = float((out.double() - want).norm() / want.norm())
    tolerance = FLOAT32_TOLERANCE if dtype == torch.float32 else HALF_TOLERANCE
    assert error < tolerance, f"m={m} n={n} k={k} {dtype} {config}: relative error {error:.2e}"


def check_int4_silu_and_mul(
    case: tuple[PackedInt4, torch.Tensor],
    m: int,
    dtype: torch.dtype,
    bias: bool,
    seed: int,
    config: Int4Config | None = None,
) -> None:
    """The gated GEMV (gate_up and SwiGLU in one launch) equals `int4_linear` then `silu_and_mul`, bit for bit; a
    config it does not gate (split-K, the GEMM) runs those two calls."""
    packed, weight = case
    gen = torch.Generator(weight.device).manual_seed(seed)
    x = torch.randn(m, weight.shape[1], generator=gen, device=weight.device).to(dtype)
    b = torch.randn(weight.shape[0], generator=gen, device=weight.device).to(dtype) if bias else None
    got = int4_linear_silu_and_mul(x, packed, b, config)
    assert got.shape == (m, weight.shape[0] // 2)
    assert torch.equal(got, silu_and_mul(int4_linear(x, packed, b, config))), f"m={m} {dtype} {config}"


def check_packed_model_layers(folder: Path) -> None:
    """A model loaded packed from the int4 checkpoint in `folder` (fused q|k|v and gate|up layers stacked by the
    loader, act-order permutations shared by their shards) runs each projection of layer 0 as the dequantized model
    does, at 1 row (GEMV) and 12 rows (GEMM): the stacked layers, whose loading differs from a plain one."""
    cfg = ArchConfig.from_folder(folder)
    assert cfg.quantization_config is not None
    models = []
    for packed in (True, False):
        quant = Gptq(cfg.quantization_config, packed=packed)
        model = build_model(cfg, TorchAttentionBackend(16, 1.0), torch.float32, torch.device("cpu"), quant)
        load_weights(model, quant.translate(checkpoint_tensors(folder, cfg)), folder)
        process_weights_after_loading(model, torch.device("cpu"))
        models.append(model)
    packed_layer, dense_layer = models[0].model.layers[0], models[1].model.layers[0]
    gen = torch.Generator().manual_seed(0)
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
        packed_linear, dense_linear = packed_layer.get_submodule(name), dense_layer.get_submodule(name)
        for rows in (1, 12):
            x = torch.randn(rows, dense_linear.in_features, generator=gen)
            want = x.double() @ dense_linear.weight.double().T
            error = float((packed_linear(x).double() - want).norm() / want.norm())
            assert error < FLOAT32_TOLERANCE, f"{name}, {rows} rows: relative error {error:.2e}"


def _gemv(block_n: int, groups: int, split_k: int, half2: int = 0) -> Int4Config:
    meta = {"BLOCK_N": block_n, "GROUPS": groups, "SPLIT_K": split_k, "HALF2": half2, "num_warps": 4}
    return Int4Config("gemv", meta)


HALF2_CONFIGS = [_gemv(16, 2, 1, half2=1), _gemv(8, 4, 1, half2=1), _gemv(16, 1, 3, half2=1)]
"""The packed half-precision GEMV (bf16/fp16 activations only), with and without split-K."""


def _gemm(block_m: int, block_n: int, groups: int) -> Int4Config:
    return Int4Config("gemm", {"BLOCK_M": block_m, "BLOCK_N": block_n, "GROUPS": groups, "GROUP_M": 2})


INTERPRETED_CONFIGS = [
    _gemv(16, 2, 1),
    _gemv(8, 4, 1),
    _gemv(16, 1, 3),
    _gemv(32, 2, 2),
    _gemm(16, 32, 1),
    _gemm(16, 16, 2),
    Int4Config("dequant", {"BLOCK_N": 16, "GROUPS": 2}),
]
"""Tiles that leave tails: 48 outputs, 384 inputs (3 groups: split 3 ways, 2 ways over 2-group tiles)."""


def run_interpreted_checks() -> None:
    """Small CPU cases (the process must start with TRITON_INTERPRET=1): every kernel (GEMV with and without
    split-K, GEMM with 1 and 2 groups per step, dequantize + matmul) on the asymmetric act-order format at 1 and 3
    rows (GEMV) or 20 rows, one of each on the other formats, on 48 outputs x 384 inputs (no tile divides either);
    the packed half-precision GEMV in bf16 and fp16 (its plain-Triton path, the GPU's roundings) on the same shape,
    and the gated GEMV (float32 and HALF2 bf16, 1 and 3 rows) against the GEMV then SiLU-and-mul;
    the default choice at 1, 2 and 9 rows on a `random_case` (as the GPU tests use); then a one-layer qwen3
    (hidden 128) GPTQ act-order checkpoint loaded packed, layer by layer."""
    for seed, name in enumerate(FORMATS):
        case = make_case(name, 48, 384, "cpu", seed)
        configs = INTERPRETED_CONFIGS if name == "gptq_v2-asym-act-order" else INTERPRETED_CONFIGS[2::2]
        for i, config in enumerate(configs):
            rows = (1 + 2 * (i % 2)) if config.kernel == "gemv" else 20
            check_int4_linear(case, rows, torch.float32, bias=(seed + i) % 2 == 0, seed=seed, config=config)
    case = make_case("gptq_v2-asym-act-order", 48, 384, "cpu", 7)
    for i, config in enumerate(HALF2_CONFIGS):
        for dtype in (torch.bfloat16, torch.float16):
            check_int4_linear(case, 1 + 2 * (i % 2), dtype, bias=i == 0, seed=i, config=config)
    for i, config in enumerate([_gemv(16, 2, 1), _gemv(8, 4, 1), HALF2_CONFIGS[0], _gemv(16, 1, 3), _gemm(16, 16, 2)]):
        dtype = torch.bfloat16 if config in HALF2_CONFIGS else torch.float32
        check_int4_silu_and_mul(case, 1 + 2 * (i % 2), dtype, bias=i % 2 == 0, seed=i, config=config)
    random = random_case(40, 256, act_order=True, device="cpu", seed=9)
    check_int4_linear(random, 1, torch.float32, bias=False, seed=9)
    check_int4_linear(random, 2, torch.float32, bias=False, seed=9)
    check_int4_linear(random, 9, torch.float32, bias=False, seed=9)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(SMALL_QWEN3, dtype=torch.float32).save_pretrained(Path(tmp) / "float")
        write_int4_checkpoint(Path(tmp) / "float", Path(tmp) / "int4", FORMATS["gptq-act-order"])
        check_packed_model_layers(Path(tmp) / "int4")
