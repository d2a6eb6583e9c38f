"""Engine configuration: frozen dataclasses, one per concern, validated on construction.

Values measured at run time (number of KV blocks, EOS ids) live in `engine.runtime_info`, never here.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.config import config_from_args, doc
from common.errors import InvalidArgumentError
from engine.spec.config import SpeculativeConfig, SpeculativeFlags

DEFAULT_MODEL = "smollm2-135m"
QUANTIZATIONS = ("auto", "none", "int8", "fp8", "gptq", "awq")
KV_CACHE_DTYPES = ("auto", "fp8")
ALL_REDUCE_BACKENDS = ("auto", "nccl")
CPU_CHUNK_TOKENS = 256
"""The chunk size on CPU when none is set: one step of 8,192 prompt tokens holds a CPU engine for minutes, and a
cancel or a deadline takes effect only between steps."""
_DTYPES = ("auto", "float32", "float16", "bfloat16")
_ONE_DEVICE_QUANTIZATIONS = ("fp8", "gptq", "awq")
"""Weight formats whose layers are not split over ranks (packed int4, fp8 GEMV tiles per whole projection)."""


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise InvalidArgumentError(field_name, message)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model: str = field(
        default=DEFAULT_MODEL,
        metadata=doc(
            "HF model folder (config.json + safetensors), a .gguf file, or a packaged alias such as smollm2-135m"
        ),
    )
    load_format: str = field(
        default="auto",
        metadata=doc("auto: safetensors weights from the model folder; dummy: random weights (benchmarks)"),
    )
    dtype: str = field(
        default="auto",
        metadata=doc(
            "weights and activations dtype: auto (the checkpoint's, float32 on CPU), float32, float16, bfloat16"
        ),
    )
    device: str = field(default="auto", metadata=doc("torch device: auto (cuda if present, else cpu), cpu, cuda"))
    quantization: str = field(
        default="auto",
        metadata=doc(
            "weight quantization: auto (the checkpoint's quantization_config, else none), none, int8 (weight-only, "
            "quantized at load), fp8 (CUDA, compute capability >= 8.9), gptq, awq (int4 checkpoints)"
        ),
    )
    quantize_lm_head: bool = field(
        default=False,
        metadata=doc(
            "run the lm_head in the weight quantization too (fp8, int8: quantized at load); default: the "
            "lm_head stays in the model dtype"
        ),
    )
    enforce_eager: bool = field(default=False, metadata=doc("run every step eagerly: no CUDA graphs"))
    seed: int = field(default=0, metadata=doc("seed for weight init of random models and unseeded sampling"))
    max_model_len: int | None = field(
        default=None, metadata=doc("longest prompt + output in tokens; default: the model's max_position_embeddings")
    )
    cpu_offload_gb: float = field(
        default=0.0,
        metadata=doc(
            "GiB of weights kept in host memory (whole decoder layers, the last ones first, sized as loaded: before "
            "a quantization at load) and copied to the device before each of them runs: serves a model a little too "
            "large for the device, at the cost of that copy every step; 0: all weights on the device"
        ),
    )

    def __post_init__(self) -> None:
        _require(bool(self.model), "model", "must name a model folder or alias")
        _require(
            self.load_format in ("auto", "dummy"), "load_format", f"must be auto or dummy, got {self.load_format!r}"
        )
        _require(self.dtype in _DTYPES, "dtype", f"must be one of {_DTYPES}, got {self.dtype!r}")
        _require(
            self.quantization in QUANTIZATIONS,
            "quantization",
            f"must be one of {QUANTIZATIONS}, got {self.quantization!r}",
        )
        _require(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "device",
            f"must be auto, cpu or cuda[:N], got {self.device!r}",
        )
        _require(
            self.max_model_len is None or self.max_model_len > 0,
            "max_model_len",
            f"must be > 0, got {self.max_model_len}",
        )
        _require(self.cpu_offload_gb >= 0, "cpu_offload_gb", f"must be >= 0, got {self.cpu_offload_gb}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = field(default=16, metadata=doc("tokens per KV block"))
    num_blocks: int | None = field(
        default=None,
        metadata=doc(
            "KV blocks in the pool; default: sized from gpu_memory_utilization (GPU) or kv_cache_memory_gib (CPU)"
        ),
    )
    gpu_memory_utilization: float = field(
        default=0.9, metadata=doc("fraction of GPU memory the engine may use, weights and KV pool together")
    )
    kv_cache_memory_gib: float = field(default=1.0, metadata=doc("KV pool size on CPU, in GiB"))
    kv_cache_dtype: str = field(
        default="auto",
        metadata=doc("KV cache dtype: auto (the model dtype), fp8 (CUDA, compute capability >= 8.9)"),
    )
    enable_prefix_caching: bool = field(default=True, metadata=doc("reuse KV blocks of equal prompt prefixes"))
    cache_salt: str | None = field(
        default=None,
        metadata=doc(
            "mixed into every block hash: caches with different salts never share blocks (a request's own "
            "cache_salt replaces it for that request)"
        ),
    )
    swap_space: float = field(
        default=0.0,
        metadata=doc(
            "GiB of host memory (pinned on CUDA) for a host tier of KV blocks: preempted requests of at least "
            "swap_min_tokens are swapped out to it instead of recomputed, and with host_prefix_cache evicted prefix "
            "blocks wait there to be copied back; 0: no host tier"
        ),
    )
    swap_min_tokens: int = field(
        default=512,
        metadata=doc(
            "a preempted request with fewer computed tokens is recomputed, a longer one swapped out (with "
            "swap_space): recomputing a short context costs about a step and often revives its own cached blocks; "
            "a decode pod's image prompt, which cannot be recomputed there, is swapped whatever its length"
        ),
    )
    host_prefix_cache: bool = field(
        default=True,
        metadata=doc(
            "with swap_space: a prefix-cache block evicted from the device is copied to the host tier's LRU first, "
            "and a prefix hit there is copied back instead of recomputed"
        ),
    )

    def __post_init__(self) -> None:
        _require(
            self.block_size > 0 and self.block_size & (self.block_size - 1) == 0,
            "block_size",
            f"must be a power of two, got {self.block_size}",
        )
        _require(self.num_blocks is None or self.num_blocks > 0, "num_blocks", f"must be > 0, got {self.num_blocks}")
        _require(
            0.0 < self.gpu_memory_utilization <= 1.0,
            "gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _require(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            "kv_cache_dtype",
            f"must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}",
        )
        _require(self.kv_cache_memory_gib > 0, "kv_cache_memory_gib", f"must be > 0, got {self.kv_cache_memory_gib}")
        _require(self.swap_space >= 0, "swap_space", f"must be >= 0, got {self.swap_space}")
        _require(self.swap_min_tokens >= 0, "swap_min_tokens", f"must be >= 0, got {self.swap_min_tokens}")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata=doc("most requests running in one batch"))
    max_num_batched_tokens: int = field(default=8192, metadata=doc("most tokens computed in one step"))
    long_prefill_token_threshold: int | None = field(
        default=None,
        metadata=doc(
            f"chunk size: most prompt tokens one request computes in a step; default: max_num_batched_tokens "
            f"(GPU), {CPU_CHUNK_TOKENS} (CPU)"
        ),
    )
    policy: str = field(default="fcfs", metadata=doc("fcfs, or priority (lower value first, then arrival)"))
    max_beam_width: int = field(
        default=16, metadata=doc("widest beam search a request may ask for (its best_of, else n); at most max_num_seqs")
    )
    async_scheduling: bool | None = field(
        default=None,
        metadata=doc(
            "schedule and prepare step N+1 while the device runs step N (outputs come one step later); "
            "default: on with CUDA, off on CPU"
        ),
    )

    def __post_init__(self) -> None:
        _require(self.max_num_seqs > 0, "max_num_seqs", f"must be > 0, got {self.max_num_seqs}")
        _require(
            self.max_num_batched_tokens > 0, "max_num_batched_tokens", f"must be > 0, got {self.max_num_batched_tokens}"
        )
        _require(
            self.long_prefill_token_threshold is None or self.long_prefill_token_threshold > 0,
            "long_prefill_token_threshold",
            f"must be > 0, got {self.long_prefill_token_threshold}",
        )
        _require(self.policy in ("fcfs", "priority"), "policy", f"must be fcfs or priority, got {self.policy!r}")
        _require(self.max_beam_width > 0, "max_beam_width", f"must be > 0, got {self.max_beam_width}")

    def for_device(self, device_type: str) -> SchedulerConfig:
        """The config a scheduler on `device_type` runs with: on CPU, with no chunk size set, CPU_CHUNK_TOKENS."""
        if device_type != "cpu" or self.long_prefill_token_threshold is not None:
            return self
        return dataclasses.replace(self, long_prefill_token_threshold=CPU_CHUNK_TOKENS)

    @property
    def chunk_size(self) -> int:
        return min(self.long_prefill_token_threshold or self.max_num_batched_tokens, self.max_num_batched_tokens)


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    tensor_parallel_size: int = field(
        default=1, metadata=doc("devices each layer is split over (worker processes: NCCL on CUDA, gloo on CPU)")
    )
    pipeline_parallel_size: int = field(default=1, metadata=doc("stages the layers are split into, one per device"))
    all_reduce: str = field(
        default="auto",
        metadata=doc(
            "TP all-reduce on CUDA: auto (small messages over peer-mapped GPU memory where every TP peer maps the "
            "others', NCCL for the rest), nccl (always NCCL)"
        ),
    )
    enable_expert_parallel: bool = field(
        default=False,
        metadata=doc("MoE models: spread the experts over the tensor-parallel ranks (each holds some experts whole)"),
    )

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(self, name)
            _require(value > 0, name, f"must be > 0, got {value}")
        _require(
            self.all_reduce in ALL_REDUCE_BACKENDS,
            "all_reduce",
            f"must be one of {', '.join(ALL_REDUCE_BACKENDS)}, got {self.all_reduce!r}",
        )

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative_config: SpeculativeConfig | None = None
    """Speculative decoding; None: off."""

    def __post_init__(self) -> None:
        _require(
            self.parallel.pipeline_parallel_size == 1 or not self.scheduler.async_scheduling,
            "async_scheduling",
            "must be off with pipeline_parallel_size > 1 (the first stage needs each step's sampled tokens)",
        )
        if self.parallel.world_size == 1:
            return
        for name, value in (("swap_space", self.cache.swap_space), ("cpu_offload_gb", self.model.cpu_offload_gb)):
            _require(
                value == 0, name, "runs on one device only (tensor_parallel_size and pipeline_parallel_size must be 1)"
            )
        _require(
            self.speculative_config is None,
            "speculative_config",
            "runs on one device only (tensor_parallel_size and pipeline_parallel_size must be 1)",
        )
        _require(
            self.model.quantization not in _ONE_DEVICE_QUANTIZATIONS,
            "quantization",
            f"{self.model.quantization!r} runs on one device only (tensor_parallel_size and pipeline_parallel_size "
            "must be 1; int8 quantizes each rank's slice at load)",
        )


ENGINE_CONFIG_PARTS = (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig)
"""The dataclasses an EngineConfig is composed of, in field order (then `speculative_config`)."""
ENGINE_FLAG_PARTS = (*ENGINE_CONFIG_PARTS, SpeculativeFlags)
"""The dataclasses whose fields are an engine's flags and `PDSERVE_*` variables (SpeculativeFlags carries
`speculative_config` as JSON): each adds its flags to a pod's parser."""


def engine_config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> EngineConfig:
    """The EngineConfig of flags added with `add_config_args` for each of ENGINE_FLAG_PARTS, else of their
    `PDSERVE_*` variables of `environ` (default: os.environ; see `common.config`)."""
    return EngineConfig(
        config_from_args(ModelConfig, args, environ=environ),
        config_from_args(CacheConfig, args, environ=environ),
        config_from_args(SchedulerConfig, args, environ=environ),
        config_from_args(ParallelConfig, args, environ=environ),
        config_from_args(SpeculativeFlags, args, environ=environ).to_config(),
    )
