"""Builds a native model from an HF folder and loads its weights by name: safetensors, or the GGUF file a GGUF
model's folder links (`engine.model_store`), each passed through the quantization's `translate`, and finished by
each linear layer's method once all are in.

Checkpoint projections that the native model runs as one GEMM (q/k/v, gate/up) land in their rows of the
`StackedLinear` that holds them; `hf_state_dict` gives the model's weights back under the checkpoint's names.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from common.errors import InvalidArgumentError
from engine.attention.backend import AttentionBackend
from engine.config import ModelConfig
from engine.kv_tier.weight_offload import host_layer_range, module_nbytes
from engine.layers.kernels import layer_kernels
from engine.layers.linear import Linear, StackedLinear
from engine.layers.quant.base import NamedTensors, QuantMethod
from engine.layers.quant.registry import resolve_quant_method
from engine.layers.quant.unquantized import Unquantized, UnquantizedLinearMethod
from engine.layers.weight_init import skipping_init
from engine.model_store import GGUF_WEIGHTS
from engine.models.arch_config import ArchConfig
from engine.models.gguf_reader import gguf_tensors
from engine.models.llama import LlamaForCausalLM
from engine.models.moe import SparseMoeBlock, moe_checkpoint_views
from engine.multimodal.text_weights import text_decoder_tensors
from engine.parallel.communicator import SINGLE_RANK, Communicator
from engine.parallel.weights import load_sharded_weights

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def build_model(
    cfg: ArchConfig,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device,
    quant: QuantMethod | None = None,
    comm: Communicator = SINGLE_RANK,
    quantize_lm_head: bool = False,
    host_layers: range = range(0),
) -> LlamaForCausalLM:
    """The model (`comm`'s shard of it) with freshly initialized weights, created directly on `device` in `dtype`,
    but for the decoder layers `host_layers`, created in host memory (`cpu_offload_gb`); its projections (and the
    lm_head with `quantize_lm_head`) run `quant`'s methods (default: unquantized) once
    `process_weights_after_loading` has run; the layers' other kernels launch early where those methods'
    GEMVs do (`LinearMethod.gemv_pdl`)."""
    kernels = layer_kernels(device)
    quant, unquantized = quant or Unquantized(), UnquantizedLinearMethod(kernels)
    linear_method = quant.linear_method(unquantized)
    head_method = quant.head_method(unquantized) if quantize_lm_head else unquantized
    if linear_method.gemv_pdl:
        kernels, backend = layer_kernels(device, pdl=True), backend.with_pdl()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg, kernels, backend, linear_method, head_method, comm, host_layers)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def _finish_linear_layers(module: torch.nn.Module) -> None:
    for child in module.modules():
        if isinstance(child, Linear):
            child.method.process_weights_after_loading(child)


@torch.no_grad()
def process_weights_after_loading(model: LlamaForCausalLM, device: torch.device) -> None:
    """Let every linear layer's method finish its loaded weights (e.g. float -> int8 + scales). A host layer
    (`build_model`'s `host_layers`) is finished on `device` as the others are, one layer at a time: copied to
    `device`, finished, copied back to host memory."""
    host_layers = [model.model.layers[i] for i in model.model.host_layers]
    for layer in host_layers:
        _finish_linear_layers(layer.to(device))
        layer.to("cpu")
    finished = {id(module) for layer in host_layers for module in layer.modules()}
    for module in model.modules():
        if isinstance(module, Linear) and id(module) not in finished:
            module.method.process_weights_after_loading(module)


def decoder_layer_nbytes(
    cfg: ArchConfig,
    backend: AttentionBackend,
    dtype: torch.dtype,
    quant: QuantMethod | None = None,
    comm: Communicator = SINGLE_RANK,
) -> list[int]:
    """Bytes of each of the stage's decoder layers as `build_model` creates them (before a quantization at load
    shrinks them), measured on a model built on the `meta` device: no memory, no random numbers drawn."""
    model = build_model(cfg, backend, dtype, torch.device("meta"), quant, comm)
    stage = model.model.stage_layers
    return [module_nbytes(layer) for layer in model.model.layers[stage.start : stage.stop]]


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files (those its index names, else every one in `folder`)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors checkpoint in {folder}")
    return files


def _safetensors(folder: Path) -> NamedTensors:
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


def checkpoint_tensors(folder: Path, cfg: ArchConfig) -> NamedTensors:
    """The checkpoint's (name, tensor) pairs under HF names: its safetensors, or its GGUF file dequantized."""
    gguf_file = folder / GGUF_WEIGHTS
    if gguf_file.exists():
        return gguf_tensors(gguf_file, cfg)
    return text_decoder_tensors(_safetensors(folder))


def _stacked_target(model: LlamaForCausalLM, name: str) -> tuple[str, slice] | None:
    """(fused parameter name, its rows) of a checkpoint tensor that is one shard of a StackedLinear."""
    parts = name.rsplit(".", 2)
    if len(parts) != 3:
        return None
    module_path, shard_name, attr = parts
    try:
        parent = model.get_submodule(module_path)
    except AttributeError:
        return None
    for child_name, child in parent.named_children():
        if isinstance(child, StackedLinear) and shard_name in child.shard_names:
            rows = slice(None) if attr in child.method.input_params else child.shard_rows(shard_name)
            return f"{module_path}.{child_name}.{attr}", rows
    return None


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, tensors: NamedTensors, source: Path, require_all: bool = True) -> None:
    """Copy every checkpoint tensor into its parameter (or its rows of a stacked one); all must be covered unless
    not `require_all`. A parameter indexed by input channel that several shards load must get equal tensors."""
    params = dict(model.named_parameters())
    expert_views = moe_checkpoint_views(model)
    loaded: set[str] = set()
    targets: set[str] = set()
    for name, tensor in tensors:
        # NOTE: a tied lm_head is the embedding parameter itself; some checkpoints store it anyway.
        tied_head = name == "lm_head.weight" and model.config.tie_word_embeddings
        if name.endswith(_IGNORED_SUFFIXES) or tied_head:
            continue
        if name in expert_views:
            expert_views[name][0].copy_(tensor)
            loaded.add(name)
            continue
        target = name if name in params else None
        rows = slice(None)
        if target is None and (stacked := _stacked_target(model, name)) is not None:
            target, rows = stacked
        if target is None:
            raise KeyError(f"{source.name}: unexpected weight {name!r} for {model.config.architecture}")
        if rows == slice(None) and target in targets and not torch.equal(params[target], tensor.to(params[target])):
            raise ValueError(f"{source.name}: {name} differs from what another shard of {target} loaded")
        params[target][rows].copy_(tensor)
        loaded.add(name)
        targets.add(target)
    missing = set(hf_names(model)) - loaded
    if missing and require_all:
        raise KeyError(f"checkpoint in {source} lacks weights: {sorted(missing)[:5]}")


def hf_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The model's parameters under the checkpoint's names (stacked ones split into views of their shards)."""
    state: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules():
        if isinstance(module, SparseMoeBlock):
            parent = module_name.rsplit(".", 1)[0]
            state |= {f"{parent}.{name}": view for name, (view, _) in module.checkpoint_views().items()}
            continue
        for attr, param in module.named_parameters(recurse=False):
            if isinstance(module, StackedLinear):
                parent = module_name.rsplit(".", 1)[0]
                whole = attr in module.method.input_params
                shards = dict.fromkeys(module.shard_names, param) if whole else module.shards(param)
                state |= {f"{parent}.{shard}.{attr}": rows for shard, rows in shards.items()}
            else:
                state[f"{module_name}.{attr}" if module_name else attr] = param
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def projection_shapes(model: LlamaForCausalLM) -> dict[str, tuple[int, int]]:
    """(out, in) of every decoder projection under its checkpoint prefix (a stacked layer's shards one by one)."""
    shapes: dict[str, tuple[int, int]] = {}
    for name, module in model.model.named_modules(prefix="model"):
        if isinstance(module, StackedLinear):
            parent = name.rsplit(".", 1)[0]
            sizes = zip(module.shard_names, module.shard_sizes, strict=True)
            shapes |= {f"{parent}.{shard}": (n, module.in_features) for shard, n in sizes}
        elif isinstance(module, Linear):
            shapes[name] = (module.out_features, module.in_features)
    return shapes


def hf_names(model: LlamaForCausalLM) -> list[str]:
    """Every checkpoint tensor name the model needs."""
    return list(hf_state_dict(model))


def _check_moe_weights(folder: Path, cfg: ArchConfig) -> None:
    """MoE experts load float weights only (their projections are no `Linear`s a quantization could take)."""
    if cfg.moe is not None and ((folder / GGUF_WEIGHTS).exists() or cfg.quantization_config is not None):
        raise InvalidArgumentError(
            "model",
            f"{folder.name}: a mixture-of-experts model loads float safetensors weights only (no GGUF or "
            "pre-quantized checkpoint)",
        )


def _check_shardable(folder: Path, cfg: ArchConfig) -> None:
    """Ranks read their slices of float safetensors tensors; packed formats are not sliced (yet)."""
    if (folder / GGUF_WEIGHTS).exists() or cfg.quantization_config is not None:
        raise InvalidArgumentError(
            "tensor_parallel_size",
            f"{folder.name}: a GGUF or pre-quantized checkpoint runs on one device only (tensor and pipeline "
            "parallelism slice float safetensors weights; --quantization int8 quantizes each slice at load)",
        )


def load_model(
    folder: Path,
    model_config: ModelConfig,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device,
    comm: Communicator = SINGLE_RANK,
) -> LlamaForCausalLM:
    """The model of `folder` (`comm`'s shard) as `model_config` asks: its checkpoint's weights (or random ones for
    load_format="dummy"), in the quantization `model_config.quantization` resolves to for this checkpoint. With
    `cpu_offload_gb`, the last decoder layers (`host_layer_range`) are built, loaded and kept in host memory; the
    caller offloads them (`offload_layers`). A host layer's random weights come from the host's generator."""
    cfg = ArchConfig.from_folder(folder)
    _check_moe_weights(folder, cfg)
    dummy = model_config.load_format == "dummy"
    quant = resolve_quant_method(model_config.quantization, cfg.quantization_config, device, random_weights=dummy)
    if comm.rank.world_size > 1:
        _check_shardable(folder, cfg)
    host_layers = range(0)
    if model_config.cpu_offload_gb > 0:
        layer_nbytes = decoder_layer_nbytes(cfg, backend, dtype, quant, comm)
        stage = comm.rank.stage_layers(cfg.num_layers)
        host_layers = host_layer_range(stage, layer_nbytes, model_config.cpu_offload_gb)
    if dummy:
        torch.manual_seed(model_config.seed)
    # NOTE: a checkpoint overwrites every parameter (the loads below check it): its model draws no random values.
    with contextlib.nullcontext() if dummy else skipping_init():
        model = build_model(cfg, backend, dtype, device, quant, comm, model_config.quantize_lm_head, host_layers)
    if dummy:
        random_tensors = quant.random_checkpoint(projection_shapes(model), device)
        load_weights(model, quant.translate(random_tensors), folder, require_all=False)
    elif comm.rank.world_size > 1:
        load_sharded_weights(model, safetensors_files(folder), cfg.tie_word_embeddings)
    else:
        load_weights(model, quant.translate(checkpoint_tensors(folder, cfg)), folder)
    process_weights_after_loading(model, device)
    return model
