"""Runs one scheduled step on the model: builds the step's inputs, runs the forward pass, samples.

The runner owns the device state (weights, KV pool, input buffers, per-request sampling seeds) and never touches
queues. `execute` only enqueues device work: the sampled tokens come back through `PendingOutput.result()`, so the
host can schedule and prepare the next step while the device runs this one (async scheduling).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.torch_backend import TorchAttentionBackend
from engine.beam.candidates import BeamCandidates, copy_blocks
from engine.config import CacheConfig, EngineConfig
from engine.cuda_graph import CudaGraphRunner
from engine.input_batch import InputBatch, ModelInput, PreviousSample
from engine.kv_tier.weight_offload import offload_layers
from engine.layers.quant.registry import resolve_kv_cache_dtype
from engine.models.arch_config import ArchConfig
from engine.models.loader import load_model
from engine.multimodal.prompt_embedder import PromptEmbedder
from engine.parallel.communicator import SINGLE_RANK, Communicator
from engine.pending_output import NO_OUTPUT, PendingOutput
from engine.sampler import Sampler, SamplingBatch
from engine.scheduler_output import ScheduledRequest, SchedulerOutput

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


class ModelRunner:
    """Runs the model on one device: the whole model, or with `comm` one rank's shard of it (a worker process of
    `engine.parallel`), whose KV pool holds its layers and KV heads."""

    def __init__(
        self,
        config: EngineConfig,
        model_path: Path,
        device: torch.device | None = None,
        comm: Communicator = SINGLE_RANK,
        draft_block_nbytes: int = 0,
    ) -> None:
        self.device = device or resolve_device(config.model.device)
        self.arch = ArchConfig.from_folder(model_path)
        self.dtype = resolve_dtype(config.model.dtype, self.arch, self.device)
        self.block_size = config.cache.block_size
        self.comm = comm
        backend = make_attention_backend(self.device, self.block_size, self.arch.head_dim**-0.5)
        self.kv_dtype = resolve_kv_cache_dtype(config.cache.kv_cache_dtype, self.dtype, self.device)
        self.model = load_model(model_path, config.model, backend, self.dtype, self.device, comm)
        host_layers = self.model.model.host_layers
        self.offloaded_layers = offload_layers([self.model.model.layers[i] for i in host_layers], self.device)
        self.prompt_embedder = PromptEmbedder.for_model(
            model_path, self.model.model.embed_tokens, self.dtype, self.device, comm.rank.world_size
        )
        kv_heads = comm.rank.kv_heads(self.arch.num_kv_heads)
        self.num_layers = len(comm.rank.stage_layers(self.arch.num_layers))
        self.num_kv_heads = kv_heads.stop - kv_heads.start
        self.num_blocks = comm.min_over_world(self._num_kv_blocks(config.cache, draft_block_nbytes), self.device)
        self.kv_cache = self._allocate_kv_pool()
        self.kv_caches = [self.kv_cache[:, layer] for layer in range(self.num_layers)]
        self.max_model_len = self._max_model_len(config.model.max_model_len)
        sched = config.scheduler
        self.input_batch = InputBatch(
            self.block_size,
            sched.max_num_seqs,
            max(sched.max_num_batched_tokens, sched.max_num_seqs),
            self.max_model_len,
            self.device,
        )
        # NOTE: stage-to-stage sends are not captured: pipeline-parallel runs decode eagerly.
        capture = self.device.type == "cuda" and not config.model.enforce_eager and comm.rank.pp_size == 1
        self.cuda_graphs = self._capture_cuda_graphs(config) if capture else None
        self._previous: PreviousSample | None = None
        self.sampler = Sampler()
        self.seeds: dict[str, int] = {}
        self._seed_rng = random.Random(config.model.seed)
        logger.info(
            "model %s on %s (%s), KV pool %d blocks x %d tokens of %s",
            model_path.name,
            self.device,
            self.dtype,
            self.num_blocks,
            self.block_size,
            self.kv_dtype,
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

    def _capture_cuda_graphs(self, config: EngineConfig) -> CudaGraphRunner:
        """Decode graphs, and with speculation verify graphs at k + 1 tokens per request."""
        sched, spec = config.scheduler, config.speculative_config
        graphs = CudaGraphRunner(
            self.model,
            self.kv_caches,
            self.input_batch.device_buffers,
            sched.max_num_seqs,
            self.max_model_len,
            verify_query_len=1 if spec is None else spec.num_speculative_tokens + 1,
            max_verify_batch_size=0 if spec is None else min(spec.disable_by_batch_size, sched.max_num_seqs),
        )
        graphs.capture()
        return graphs

    def _allocate_kv_pool(self) -> torch.Tensor:
        pool = torch.zeros(
            (self.num_blocks, self.num_layers, 2, self.block_size, self.num_kv_heads, self.arch.head_dim),
            dtype=self.kv_dtype,
            device=self.device,
        )
        if self.comm.rank.world_size > 1 and self.device.type == "cpu":
            # NOTE: the engine process reads and writes this rank's pool (KV transfer) through shared memory.
            pool.share_memory_()
        return pool

    @property
    def block_nbytes(self) -> int:
        return self.kv_cache[0].numel() * self.kv_cache.element_size()

    @property
    def kv_pools(self) -> list[torch.Tensor]:
        """Each rank's KV pool (this runner's only)."""
        return [self.kv_cache]

    @property
    def kv_pool_handles(self) -> list[dict[str, Any] | None]:
        """None: the pool is this process's own."""
        return [None]

    def _num_kv_blocks(self, cache: CacheConfig, draft_block_nbytes: int = 0) -> int:
        """Blocks the budget holds; with a draft model (engine.spec.draft_runner) each block id also has
        `draft_block_nbytes` of draft KV, paid from the same budget."""
        if cache.num_blocks is not None:
            return cache.num_blocks
        block_nbytes = draft_block_nbytes + (
            self.num_layers * 2 * self.block_size * self.num_kv_heads * self.arch.head_dim * self.kv_dtype.itemsize
        )
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = int(total * cache.gpu_memory_utilization) - (total - free)
        else:
            budget = int(cache.kv_cache_memory_gib * 2**30)
        if budget < block_nbytes:
            raise MemoryError(f"no memory left for the KV pool (budget {budget} bytes, one block {block_nbytes})")
        return budget // block_nbytes

    def _graph_shape(self, scheduler_output: SchedulerOutput) -> tuple[int, int] | None:
        """The captured (batch size, query length) a step replays at: pure decode batches at query length 1, verify
        batches (every request a decode, some with proposals) at k + 1; None for a step that runs eagerly."""
        graphs = self.cuda_graphs
        scheduled = scheduler_output.scheduled
        if graphs is None:
            return None
        if all(len(r.token_ids) == 1 for r in scheduled):
            return (graphs.batch_size_for(len(scheduled)), 1) if len(scheduled) <= graphs.max_batch_size else None
        query_len = graphs.verify_query_len
        for r in scheduled:
            decode = r.sample and len(r.token_ids) == 1 + len(r.draft_token_ids)
            if not decode or r.num_computed_tokens + query_len > self.max_model_len:
                return None
        bs = graphs.verify_batch_size_for(len(scheduled))
        return None if bs is None else (bs, query_len)

    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> ModelInput:
        """The step's device inputs (the eager layout; `execute` also prepares graph replays)."""
        return self.input_batch.prepare(scheduler_output, None, self._previous)

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Enqueue the step on the device; the sampled tokens arrive through the returned PendingOutput."""
        for req_id in scheduler_output.finished_req_ids:
            self.seeds.pop(req_id, None)
        self.input_batch.drop(scheduler_output.finished_req_ids)
        copy_blocks(self.kv_cache, scheduler_output.block_copies)
        if not scheduler_output.scheduled:
            self._previous = None
            return NO_OUTPUT
        # NOTE: a step computing image placeholders runs eagerly, on input embeddings.
        images = self.prompt_embedder is not None and self.prompt_embedder.has_images(scheduler_output.scheduled)
        graph_shape = None if images else self._graph_shape(scheduler_output)
        graph_bs, query_len = (None, 1) if graph_shape is None else graph_shape
        inputs = self.input_batch.prepare(scheduler_output, graph_bs, self._previous, query_len)
        if graph_bs is not None:
            assert self.cuda_graphs is not None
            hidden = self.cuda_graphs.replay(graph_bs, query_len)
        else:
            embeds = None
            if images:
                assert self.prompt_embedder is not None
                qsl = inputs.metadata.query_start_loc_cpu
                embeds = self.prompt_embedder.embeddings(scheduler_output.scheduled, inputs.input_ids, qsl)
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.metadata, embeds)
        sampling = [r for r in scheduler_output.scheduled if r.sample]
        if not sampling or not self.comm.rank.is_last_stage:
            self._previous = None
            return NO_OUTPUT
        # NOTE: a pure decode batch samples every row in order: no gather needed.
        decode_graph = graph_bs is not None and query_len == 1
        rows = hidden[: len(sampling)] if decode_graph else hidden.index_select(0, inputs.logits_indices)
        logits = self.model.compute_logits(rows)
        batch = self._sampling_batch(sampling) if len(rows) > len(sampling) else self._decode_batch(sampling)
        sampled = self.sampler(logits, batch)
        req_ids = [r.req_id for r in sampling]
        drafts = [r.draft_token_ids for r in sampling]
        # NOTE: a step that verified proposals is never followed by placeholders (LLMEngine.step waits for it).
        previous_rows = {req_id: row for row, req_id in enumerate(req_ids)} if len(rows) == len(sampling) else {}
        self._previous = PreviousSample(sampled.token_ids, previous_rows)
        return PendingOutput(req_ids, sampled, drafts, BeamCandidates.gather(logits, sampling))

    def _decode_batch(self, sampling: list[ScheduledRequest]) -> SamplingBatch:
        """One row per request: the token after the step's last one, placeholders (async scheduling) included."""
        return SamplingBatch(
            params=[r.sampling_params for r in sampling],
            seeds=[None if r.sampling_params.greedy else self._seed(r) for r in sampling],
            positions=[r.num_computed_tokens + len(r.token_ids) for r in sampling],
            prompt_token_ids=[r.prompt_token_ids for r in sampling],
            output_token_ids=[r.output_token_ids for r in sampling],
        )

    def _sampling_batch(self, sampling: list[ScheduledRequest]) -> SamplingBatch:
        """With proposals to verify: one row per proposal too, sampled exactly as the same position would be
        without speculation (same seed, position and output so far), so accepting the proposals up to the first
        that differs from its row's sample keeps the output that of the target model, token for token."""
        batch = SamplingBatch([], [], [], [], [])
        for r in sampling:
            seed = None if r.sampling_params.greedy else self._seed(r)
            first = r.num_computed_tokens + len(r.token_ids) - len(r.draft_token_ids)
            for j in range(len(r.draft_token_ids) + 1):
                batch.params.append(r.sampling_params)
                batch.seeds.append(seed)
                batch.positions.append(first + j)
                batch.prompt_token_ids.append(r.prompt_token_ids)
                history = r.output_token_ids
                if j and r.sampling_params.has_penalty:
                    history = [*history, *r.draft_token_ids[:j]]
                batch.output_token_ids.append(history)
        return batch

    def _seed(self, req: ScheduledRequest) -> int:
        """The request's sampling seed: its own, or one drawn once for it (an unseeded request need not be
        reproducible across pods, only its draws independent of the batch)."""
        seed = req.sampling_params.seed
        if seed is not None:
            return seed
        drawn = self.seeds.get(req.req_id)
        if drawn is None:
            drawn = self.seeds[req.req_id] = self._seed_rng.getrandbits(63)
        return drawn
