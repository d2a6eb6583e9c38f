"""Runs one scheduled step on the model: builds the flat batch, runs the forward pass, samples.

The runner owns the device state (weights, KV pool, per-request generators) and never touches queues.
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import CacheConfig, EngineConfig
from engine.cuda_graph import CudaGraphRunner
from engine.models.arch_config import ArchConfig
from engine.models.loader import build_model, load_model
from engine.sampler import Sampler, SamplingBatch
from engine.scheduler_output import RunnerOutput, ScheduledRequest, SchedulerOutput

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def make_attention_backend(device: torch.device, block_size: int, scale: float) -> AttentionBackend:
    """Triton kernels on CUDA, the torch reference elsewhere (chosen once, at start-up)."""
    if device.type == "cuda":
        from engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(block_size, scale)
    return TorchAttentionBackend(block_size, scale)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, arch: ArchConfig, device: torch.device) -> torch.dtype:
    """`auto`: float32 on CPU; on GPU the checkpoint's 16-bit dtype, else bfloat16."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return _DTYPES[arch.torch_dtype] if arch.torch_dtype in ("float16", "bfloat16") else torch.bfloat16


@dataclass(slots=True)
class FlatBatch:
    """A step's requests laid end to end, as host lists."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slot_mapping: list[int] = field(default_factory=list)
    query_start_loc: list[int] = field(default_factory=lambda: [0])
    seq_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    logits_indices: list[int] = field(default_factory=list)


@dataclass(slots=True)
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    logits_indices: list[int]


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: Path) -> None:
        self.device = resolve_device(config.model.device)
        self.arch = ArchConfig.from_folder(model_path)
        self.dtype = resolve_dtype(config.model.dtype, self.arch, self.device)
        self.block_size = config.cache.block_size
        backend = make_attention_backend(self.device, self.block_size, self.arch.head_dim**-0.5)
        if config.model.load_format == "dummy":
            torch.manual_seed(config.model.seed)
            self.model = build_model(self.arch, backend, self.dtype, self.device)
        else:
            self.model = load_model(model_path, backend, self.dtype, self.device)
        self.num_blocks = self._num_kv_blocks(config.cache)
        self.kv_cache = torch.zeros(
            (self.num_blocks, self.arch.num_layers, 2, self.block_size, self.arch.num_kv_heads, self.arch.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        self.kv_caches = [self.kv_cache[:, layer] for layer in range(self.arch.num_layers)]
        self.max_model_len = self._max_model_len(config.model.max_model_len)
        self.cuda_graphs: CudaGraphRunner | None = None
        if self.device.type == "cuda" and not config.model.enforce_eager:
            self.cuda_graphs = CudaGraphRunner(
                self.model, self.kv_caches, config.scheduler.max_num_seqs, self.max_model_len, self.block_size
            )
            self.cuda_graphs.capture()
        self.sampler = Sampler()
        self.generators: dict[str, torch.Generator] = {}
        self._seed_rng = random.Random(config.model.seed)
        logger.info(
            "model %s on %s (%s), KV pool %d blocks x %d tokens",
            model_path.name,
            self.device,
            self.dtype,
            self.num_blocks,
            self.block_size,
        )

    def _max_model_len(self, configured: int | None) -> int:
        """The configured (or the model's) context length, capped by sliding window and KV pool size."""
        max_model_len = configured or self.arch.max_position_embeddings
        if self.arch.sliding_window is not None:
            max_model_len = min(max_model_len, self.arch.sliding_window)
        pool_tokens = self.num_blocks * self.block_size
        if max_model_len > pool_tokens:
            logger.warning("max_model_len %d capped to the KV pool's %d tokens", max_model_len, pool_tokens)
        return min(max_model_len, pool_tokens)

    @property
    def block_nbytes(self) -> int:
        return self.kv_cache[0].numel() * self.kv_cache.element_size()

    def _num_kv_blocks(self, cache: CacheConfig) -> int:
        if cache.num_blocks is not None:
            return cache.num_blocks
        block_nbytes = (
            self.arch.num_layers
            * 2
            * self.block_size
            * self.arch.num_kv_heads
            * self.arch.head_dim
            * torch.finfo(self.dtype).bits
            // 8
        )
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = int(total * cache.gpu_memory_utilization) - (total - free)
        else:
            budget = int(cache.kv_cache_memory_gib * 2**30)
        if budget < block_nbytes:
            raise MemoryError(f"no memory left for the KV pool (budget {budget} bytes, one block {block_nbytes})")
        return budget // block_nbytes

    def _flatten(self, scheduler_output: SchedulerOutput) -> FlatBatch:
        flat = FlatBatch()
        bs = self.block_size
        for req in scheduler_output.scheduled:
            start, end = req.num_computed_tokens, req.num_computed_tokens + len(req.token_ids)
            flat.input_ids.extend(req.token_ids)
            flat.positions.extend(range(start, end))
            flat.slot_mapping.extend(req.block_ids[p // bs] * bs + p % bs for p in range(start, end))
            flat.query_start_loc.append(len(flat.input_ids))
            flat.seq_lens.append(end)
            flat.block_tables.append(req.block_ids)
            if req.sample:
                flat.logits_indices.append(len(flat.input_ids) - 1)
        return flat

    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> ModelInput:
        flat = self._flatten(scheduler_output)
        max_blocks = max(len(row) for row in flat.block_tables)
        block_table = [row + [0] * (max_blocks - len(row)) for row in flat.block_tables]
        qsl = flat.query_start_loc
        metadata = AttentionMetadata(
            query_start_loc=self._tensor(qsl, torch.int32),
            seq_lens=self._tensor(flat.seq_lens, torch.int32),
            block_table=self._tensor(block_table, torch.int32),
            slot_mapping=self._tensor(flat.slot_mapping, torch.int64),
            max_query_len=max(b - a for a, b in itertools.pairwise(qsl)),
            max_seq_len=max(flat.seq_lens),
            query_start_loc_cpu=qsl,
            seq_lens_cpu=flat.seq_lens,
        )
        return ModelInput(
            self._tensor(flat.input_ids, torch.int64),
            self._tensor(flat.positions, torch.int64),
            metadata,
            flat.logits_indices,
        )

    def _forward(self, scheduler_output: SchedulerOutput) -> tuple[torch.Tensor, list[int]]:
        """Hidden states of the step's tokens (a CUDA graph replay for decode batches), and rows to sample."""
        graphs = self.cuda_graphs
        num_reqs = len(scheduler_output.scheduled)
        if (
            graphs is not None
            and num_reqs <= graphs.max_batch_size
            and all(len(r.token_ids) == 1 for r in scheduler_output.scheduled)
        ):
            flat = self._flatten(scheduler_output)
            hidden = graphs.run(flat.input_ids, flat.positions, flat.slot_mapping, flat.seq_lens, flat.block_tables)
            return hidden, flat.logits_indices
        inputs = self.prepare_inputs(scheduler_output)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.metadata)
        return hidden, inputs.logits_indices

    def _tensor(self, data: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        for req_id in scheduler_output.finished_req_ids:
            self.generators.pop(req_id, None)
        if not scheduler_output.scheduled:
            return RunnerOutput()
        hidden, logits_indices = self._forward(scheduler_output)
        sampling = [r for r in scheduler_output.scheduled if r.sample]
        if not sampling:
            return RunnerOutput()
        logits = self.model.compute_logits(hidden[logits_indices])
        batch = SamplingBatch(
            params=[r.sampling_params for r in sampling],
            generators=[None if r.sampling_params.greedy else self._generator(r, logits.shape[1]) for r in sampling],
            prompt_token_ids=[r.prompt_token_ids for r in sampling],
            output_token_ids=[r.output_token_ids for r in sampling],
        )
        out = self.sampler(logits, batch)
        req_ids = [r.req_id for r in sampling]
        return RunnerOutput(
            dict(zip(req_ids, out.sampled_token_ids, strict=True)), dict(zip(req_ids, out.logprobs, strict=True))
        )

    def _generator(self, req: ScheduledRequest, vocab_size: int) -> torch.Generator:
        """The request's own RNG stream: its samples do not depend on what else is in the batch.

        NOTE: a request that arrives with output tokens (prefilled on another pod) continues its seeded stream
        where the other pod stopped: one draw per token already sampled, each `vocab_size` exponentials, exactly
        as many as the sampler consumes per sampled token.
        """
        generator = self.generators.get(req.req_id)
        if generator is None:
            seed = req.sampling_params.seed
            generator = torch.Generator(device=self.device)
            generator.manual_seed(self._seed_rng.getrandbits(63) if seed is None else seed)
            if seed is not None and req.output_token_ids:
                draws = torch.empty((len(req.output_token_ids), vocab_size), dtype=torch.float32, device=self.device)
                for row in draws:
                    row.exponential_(generator=generator)
            self.generators[req.req_id] = generator
        return generator
