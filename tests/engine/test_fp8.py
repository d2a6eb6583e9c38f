"""FP8 weights and KV cache on CPU: quantizer values against a nearest-value reference, the compressed-tensors
loader on a checkpoint written here, start-up refusals, the KV layout's scales, and the kernels in Triton's
interpreter. tests/engine/test_fp8_gpu.py runs the same kernels and the engine on the GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.errors import InvalidArgumentError
from engine.attention.decode_tuning import DecodeLaunch, decode_launch
from engine.attention.torch_backend import TorchAttentionBackend
from engine.layers.linear import Linear, StackedLinear
from engine.layers.quant import registry
from engine.layers.quant.fp8 import (
    FP8_DTYPE,
    CompressedTensorsFp8,
    Fp8LinearMethod,
    dequantize_fp8,
    fp8_linear_reference,
    quantize_fp8_rows,
)
from engine.layers.quant.registry import resolve_kv_cache_dtype, resolve_quant_method
from engine.layers.triton_fp8_linear import TUNED_TILES, Fp8GemvTiles, default_tiles, load_tiles, tiles_json
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.arch_config import ArchConfig
from engine.models.loader import build_model, checkpoint_tensors, load_weights, process_weights_after_loading
from kv_transfer import KVLayout, LayoutMismatchError
from tests.engine.model_factory import make_prompts, save_tiny_model
from tests.engine.quant_support import prompt_logits
from tests.engine.triton_interpreter import run_interpreted

CPU = torch.device("cpu")
FP8_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float()
FINITE_FP8 = FP8_VALUES[torch.isfinite(FP8_VALUES)].unique()


def nearest_fp8(x: torch.Tensor) -> torch.Tensor:
    """The reference rounding: the finite E4M3 value nearest to each element (by search over all 256 codes)."""
    return FINITE_FP8[(x.reshape(-1, 1) - FINITE_FP8).abs().argmin(dim=1)].reshape(x.shape)


def test_quantize_fp8_rows_is_absmax_per_row_and_rounds_to_the_nearest_value() -> None:
    weight = torch.randn(24, 80, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 24)[:, None]
    weight[5] = 0.0
    q, scale = quantize_fp8_rows(weight)
    assert q.dtype == FP8_DTYPE and q.shape == (24, 80) and scale.dtype == torch.float32 and scale.shape == (24,)
    absmax = weight.abs().amax(dim=1)
    assert torch.allclose(scale[absmax > 0], absmax[absmax > 0] / 448, rtol=1e-6)
    assert torch.equal(q.float().abs().amax(dim=1)[absmax > 0], torch.full((23,), 448.0))
    assert torch.equal(q.float(), nearest_fp8(weight / scale[:, None]))
    assert not bool(q[5].float().any())
    error = (dequantize_fp8(q, scale) - weight).abs()
    # NOTE: E4M3 keeps 3 mantissa bits: half a step is 2^-4 of the value (2^-10 of the scale among subnormals).
    assert bool((error <= torch.maximum(weight.abs() / 16, scale[:, None] / 1024) + 1e-12).all())


def test_fp8_linear_reference_quantizes_each_token_on_its_own() -> None:
    gen = torch.Generator().manual_seed(1)
    q, scale = quantize_fp8_rows(torch.randn(16, 64, generator=gen))
    x = torch.randn(3, 64, generator=gen) * torch.tensor([[1e-3], [1.0], [1e3]])
    out = fp8_linear_reference(x, q, scale, None)
    exact = x.double() @ dequantize_fp8(q, scale).double().T
    for row in range(3):
        assert float((out[row] - exact[row]).norm() / exact[row].norm()) < 0.04
    assert torch.equal(fp8_linear_reference(x[1:2], q, scale, None), out[1:2])


def quantize_checkpoint(
    folder: Path, per_tensor: tuple[str, ...], config: dict[str, Any], ignored: str = "-"
) -> dict[str, Any]:
    """Rewrite a float checkpoint in the compressed-tensors FP8 layout: every decoder projection as an fp8
    `weight` and a `weight_scale`, [out, 1] per channel, or one value for the projections named in `per_tensor`;
    the projection named `ignored` stays float."""
    tensors = load_file(str(folder / "model.safetensors"))
    written: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if ".layers." not in name or not name.endswith("proj.weight") or name.startswith(ignored):
            written[name] = tensor
            continue
        if any(f".{p}." in name for p in per_tensor):
            scale = tensor.abs().max().reshape(1) / 448
            q = (tensor / scale).to(FP8_DTYPE)
        else:
            q, scale = quantize_fp8_rows(tensor)
            scale = scale[:, None]
        written[name], written[name.removesuffix("weight") + "weight_scale"] = q, scale
    save_file(written, str(folder / "model.safetensors"))
    raw = json.loads((folder / "config.json").read_text())
    raw["quantization_config"] = config
    (folder / "config.json").write_text(json.dumps(raw))
    return written


def fp8_config(weights_strategy: str = "channel", inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    scheme = {"type": "float", "num_bits": 8, "symmetric": True, "dynamic": False, "strategy": weights_strategy}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": scheme,
                "input_activations": inputs or {"type": "float", "num_bits": 8, "dynamic": True, "strategy": "token"},
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


def test_compressed_tensors_checkpoint_loads_as_it_is(tmp_path: Path) -> None:
    folder = save_tiny_model("qwen3", tmp_path)
    ignored = "model.layers.0.self_attn.o_proj"
    config = fp8_config() | {"ignore": ["lm_head", ignored]}
    written = quantize_checkpoint(folder, per_tensor=("k_proj", "down_proj"), config=config, ignored=ignored)
    cfg = ArchConfig.from_folder(folder)
    quant = CompressedTensorsFp8(cfg.quantization_config or {}, fp8_linear_reference)
    model = build_model(cfg, TorchAttentionBackend(16, 0.1), torch.float32, CPU, quant)
    load_weights(model, quant.translate(checkpoint_tensors(folder, cfg)), folder)
    process_weights_after_loading(model, CPU)
    qkv = model.get_submodule("model.layers.1.self_attn.qkv_proj")
    assert isinstance(qkv, StackedLinear)
    rows = {shard: qkv.shard_rows(shard) for shard in ("q_proj", "k_proj", "v_proj")}
    for shard, shard_rows in rows.items():
        name = f"model.layers.1.self_attn.{shard}.weight"
        assert torch.equal(qkv.weight[shard_rows].view(torch.uint8), written[name].view(torch.uint8))
        scale = qkv.get_parameter("weight_scale")[shard_rows]
        assert torch.equal(
            scale, written[name.removesuffix("weight") + "weight_scale"].float().reshape(-1).expand(len(scale))
        )
    down_scale = model.get_parameter("model.layers.0.mlp.down_proj.weight_scale")
    assert model.get_parameter("model.layers.0.mlp.down_proj.weight").dtype == FP8_DTYPE
    assert bool((down_scale == down_scale[0]).all())
    assert model.lm_head.weight.dtype == torch.float32 and model.model.embed_tokens.weight.dtype == torch.float32
    want_q, want_scale = quantize_fp8_rows(written[f"{ignored}.weight"])
    assert torch.equal(model.get_parameter(f"{ignored}.weight").view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(model.get_parameter(f"{ignored}.weight_scale"), want_scale)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (
            fp8_config(inputs={"type": "float", "num_bits": 8, "dynamic": False, "strategy": "tensor"}),
            "input_activations",
        ),
        (fp8_config(weights_strategy="group"), "weights"),
        ({**fp8_config(), "format": "int-quantized"}, "quantization_config.format"),
        ({**fp8_config(), "kv_cache_scheme": {"num_bits": 8}}, "quantization_config.kv_cache_scheme"),
    ],
    ids=["static-inputs", "group-weights", "int-format", "kv-scheme"],
)
def test_other_compressed_tensors_schemes_are_refused_naming_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        CompressedTensorsFp8(config, fp8_linear_reference)
    assert caught.value.field.endswith(field)


def test_fp8_needs_a_capable_cuda_device() -> None:
    for requested, checkpoint in (("fp8", None), ("auto", fp8_config())):
        with pytest.raises(InvalidArgumentError, match=r"compute capability >= 8\.9 \(this device: cpu\)") as caught:
            resolve_quant_method(requested, checkpoint, CPU)
        assert caught.value.field == "quantization"
    with pytest.raises(InvalidArgumentError, match="checkpoint is compressed-tensors-quantized"):
        resolve_quant_method("int8", fp8_config(), CPU)
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, CPU) is torch.bfloat16
    with pytest.raises(InvalidArgumentError, match=r"compute capability >= 8\.9") as caught:
        resolve_kv_cache_dtype("fp8", torch.bfloat16, CPU)
    assert caught.value.field == "kv_cache_dtype"


def test_quantize_at_load_keeps_fp8_weights_and_channel_scales() -> None:
    layer = Linear(64, 32, bias=True, method=Fp8LinearMethod(fp8_linear_reference, from_checkpoint=False))
    weight = layer.weight.detach().clone()
    assert layer.bias is not None
    layer.method.process_weights_after_loading(layer)
    assert layer.weight.dtype == FP8_DTYPE and layer.get_parameter("weight_scale").shape == (32,)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    exact = x @ weight.T + layer.bias
    assert float((layer(x) - exact).norm() / exact.norm()) < 0.04


def test_fp8_engine_quantizes_every_projection_and_tracks_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole engine with quantization="fp8", its GEMM swapped for the torch reference (the device check is what
    refuses CPU): every decoder projection fp8, embedding and lm_head float32, prompt logits near float32's."""
    folder = save_tiny_model("qwen3", tmp_path)
    monkeypatch.setattr(registry, "_fp8_gemms", lambda field_name, device: (fp8_linear_reference, None))
    prompt = make_prompts(vocab_size=512)[9]
    reference = prompt_logits(LLMEngine(engine_config(str(folder), device="cpu", num_blocks=32)), prompt)
    engine = LLMEngine(engine_config(str(folder), device="cpu", num_blocks=32, quantization="fp8"))
    projections = [m for m in engine.runner.model.model.modules() if isinstance(m, Linear)]
    assert len(projections) == 2 * 4 and all(m.weight.dtype == FP8_DTYPE for m in projections)
    assert engine.runner.model.lm_head.weight.dtype == torch.float32
    error = (prompt_logits(engine, prompt) - reference).abs() / reference.std()
    # NOTE: the bounds of tests/engine/test_fp8_gpu.py (its docstring gives the reasoning); measured here: mean 0.038,
    # max 0.30. E4M3's error is visible (int8 per channel gives 0.007 on this model): a path that silently kept the
    # float weights would sit far below 0.01.
    assert 0.01 < error.mean().item() <= 0.15 and error.max().item() <= 1.0, (error.mean().item(), error.max().item())


def test_kv_layouts_with_other_scales_are_refused_and_scales_travel() -> None:
    ours = KVLayout("float8_e4m3fn", 16, 36, 8, 128, k_scale=1.0, v_scale=1.0)
    theirs = KVLayout("float8_e4m3fn", 16, 36, 8, 128, k_scale=0.5, v_scale=1.0)
    with pytest.raises(LayoutMismatchError, match=r"k_scale: 1\.0 vs 0\.5") as caught:
        ours.check_compatible(theirs)
    assert caught.value.fields == ("k_scale",)
    assert KVLayout.from_dict(json.loads(json.dumps(theirs.to_dict()))) == theirs
    before_fp8 = {k: v for k, v in ours.to_dict().items() if not k.endswith("_scale")}
    assert KVLayout.from_dict(before_fp8) == ours
    assert KVLayout.from_pool(torch.zeros(2, 36, 2, 16, 8, 128, dtype=FP8_DTYPE), 16) == ours
    with pytest.raises(InvalidArgumentError) as bad:
        KVLayout("float8_e4m3fn", 16, 36, 8, 128, k_scale=0.0)
    assert bad.value.field == "k_scale"


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests/engine/test_fp8_gpu.py runs the compiled kernels")
def test_fp8_kernels_in_triton_interpreter() -> None:
    run_interpreted("tests.engine.fp8_checks", "run_interpreted_checks")


def test_tuned_tables_read_back_and_fit_their_shapes(tmp_path: Path) -> None:
    """The committed tables (written on the GPU) parse, every GEMV entry tiles its shape whole, and a table written
    by the tuner reads back equal; a dtype the decode table does not name takes the bf16 kernel's settings."""
    for (n, k), tiles in TUNED_TILES.items():
        assert n % tiles.block_n == 0 and k % tiles.block_k == 0 and default_tiles(n, k) == tiles
    table = {(48, 384): Fp8GemvTiles(16, 128, num_warps=8, num_stages=2, unroll=4)}
    (tmp_path / "tiles.json").write_text(tiles_json(table))
    assert load_tiles(tmp_path / "tiles.json") == table and load_tiles(tmp_path / "missing.json") == {}
    fp8 = decode_launch("float8_e4m3fn")
    assert fp8.tiles.block_n % 16 == 0 and fp8.programs_per_sm >= 1
    assert decode_launch("no-such-dtype") == DecodeLaunch()
