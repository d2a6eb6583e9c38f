"""The draft model's runner: a `ModelRunner` over a small model whose KV pool is indexed by the target's block ids.

Built in two steps, because the draft's KV comes out of the target's pool budget:
1. `load_draft_runner(config, target_path)` checks the draft's vocabulary against the target's and loads its weights
   (with a one-block pool and no CUDA graphs), so the target's pool sizing sees them as used memory;
2. the target's runner sizes its pool with `draft_block_nbytes=draft.block_nbytes`: every block id then holds the
   target's KV in the target's pool and the draft's KV in the draft's, and the budget is divided by the sum of both
   block sizes (Qwen3-8B with a Qwen3-0.6B draft: 144 + 112 KiB per token, the draft's share 44%);
3. `attach_pool(num_blocks, max_model_len)` allocates the draft's pool at the target's block count and captures its
   CUDA graphs: decode batches at query length 1 (the draft's autoregressive steps) and 2 (a round's first step,
   which feeds the bonus token and, after a fully accepted round, the last proposal too).

No block manager of its own: a request's draft KV sits at the slots of its target block table, so blocks are freed,
trimmed after a rejection and preempted with the target's (engine.spec.draft_model keeps track of what is valid).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from common.errors import InvalidArgumentError
from engine.config import CacheConfig, EngineConfig, ParallelConfig
from engine.cuda_graph import CudaGraphRunner
from engine.model_runner import ModelRunner, resolve_device, resolve_dtype
from engine.model_store import resolve_model
from engine.models.arch_config import ArchConfig
from engine.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)

_FIELD = "speculative_config.model"


class DraftRunner(ModelRunner):
    def __init__(self, config: EngineConfig, draft_path: Path) -> None:
        self._config = config
        # NOTE: eager until `attach_pool`, which captures the graphs on the real pool.
        super().__init__(
            dataclasses.replace(config, model=dataclasses.replace(config.model, enforce_eager=True)), draft_path
        )
        self._capture = self.device.type == "cuda" and not config.model.enforce_eager

    def _num_kv_blocks(self, cache: CacheConfig, draft_block_nbytes: int = 0) -> int:
        # NOTE: one block until `attach_pool`: enough to know a block's size.
        return 1

    def _max_model_len(self, configured: int | None) -> int:
        """The configured (the target's) or the draft's own context length, capped by its sliding window; the pool
        does not cap it here (`attach_pool` caps it to the target's)."""
        max_model_len = configured or self.arch.max_position_embeddings
        if self.arch.sliding_window is not None:
            max_model_len = min(max_model_len, self.arch.sliding_window)
        return max_model_len

    def attach_pool(self, num_blocks: int, max_model_len: int) -> None:
        """Allocate the pool at the target's block count, and capture the CUDA graphs on it."""
        self.num_blocks = num_blocks
        self.kv_cache = self._allocate_kv_pool()
        self.kv_caches = [self.kv_cache[:, layer] for layer in range(self.num_layers)]
        self.max_model_len = min(self.max_model_len, max_model_len)
        if self._capture:
            self.cuda_graphs = self._capture_cuda_graphs(self._config)
        logger.info("draft KV pool %d blocks (%d bytes each) beside the target's", num_blocks, self.block_nbytes)

    def _capture_cuda_graphs(self, config: EngineConfig) -> CudaGraphRunner:
        sched = config.scheduler
        graphs = CudaGraphRunner(
            self.model,
            self.kv_caches,
            self.input_batch.device_buffers,
            sched.max_num_seqs,
            self.max_model_len,
            verify_query_len=2,
            max_verify_batch_size=sched.max_num_seqs,
        )
        graphs.capture(show_progress=False)
        return graphs

    def _graph_shape(self, scheduler_output: SchedulerOutput) -> tuple[int, int] | None:
        """Every request samples after 1 or 2 tokens: the captured (batch size, 1 or 2); else eager."""
        graphs, scheduled = self.cuda_graphs, scheduler_output.scheduled
        if graphs is None or len(scheduled) > graphs.max_batch_size or not all(r.sample for r in scheduled):
            return None
        query_len = max(len(r.token_ids) for r in scheduled)
        if query_len == 1:
            return graphs.batch_size_for(len(scheduled)), 1
        if query_len > 2 or any(r.num_computed_tokens + 2 > self.max_model_len for r in scheduled):
            return None
        bs = graphs.verify_batch_size_for(len(scheduled))
        return None if bs is None else (bs, 2)


def load_draft_runner(config: EngineConfig, target_path: Path) -> DraftRunner:
    """The draft model of `config.speculative_config`, loaded in the target's dtype, its pool not yet attached."""
    spec = config.speculative_config
    assert spec is not None
    draft_path = resolve_draft(spec.model)
    check_vocab(target_path, draft_path)
    device = resolve_device(config.model.device)
    target_dtype = resolve_dtype(config.model.dtype, ArchConfig.from_folder(target_path), device)
    sched = config.scheduler
    draft_config = EngineConfig(
        model=dataclasses.replace(
            config.model,
            model=spec.model,
            dtype=str(target_dtype).removeprefix("torch."),
            quantization="auto",
            quantize_lm_head=False,
            # NOTE: `cpu_offload_gb` is the target's budget; the draft, small and run k times a step, stays whole.
            cpu_offload_gb=0.0,
        ),
        cache=config.cache,
        # NOTE: nothing is proposed while disable_by_batch_size requests run: the draft's batches stay below it.
        scheduler=dataclasses.replace(sched, max_num_seqs=min(spec.disable_by_batch_size, sched.max_num_seqs)),
        parallel=ParallelConfig(),
    )
    return DraftRunner(draft_config, draft_path)


def resolve_draft(name: str) -> Path:
    try:
        return resolve_model(name)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(_FIELD, exc.description) from None


def check_vocab(target_path: Path, draft_path: Path) -> None:
    """Refuse a draft whose token ids mean other tokens than the target's: with both tokenizers present their
    vocabularies must be equal and the draft's vocab_size at most the target's (padded embedding rows may differ);
    without them, equal vocab_size."""
    target_vocab, draft_vocab = _tokenizer_vocab(target_path), _tokenizer_vocab(draft_path)
    target_size = ArchConfig.from_folder(target_path).vocab_size
    draft_size = ArchConfig.from_folder(draft_path).vocab_size
    if target_vocab is not None and draft_vocab is not None:
        if target_vocab != draft_vocab:
            raise InvalidArgumentError(_FIELD, f"{draft_path}: its tokenizer differs from the target model's")
        if draft_size > target_size:
            raise InvalidArgumentError(
                _FIELD, f"{draft_path}: vocab_size {draft_size} exceeds the target model's {target_size}"
            )
    elif draft_size != target_size:
        raise InvalidArgumentError(
            _FIELD, f"{draft_path}: vocab_size {draft_size} differs from the target model's {target_size}"
        )


def _tokenizer_vocab(folder: Path) -> tuple[dict[str, int], list[tuple[str, int]]] | None:
    """The token -> id map and added tokens of the folder's tokenizer.json; None without one."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    tokenizer = json.loads(path.read_text())
    added = sorted((t["content"], t["id"]) for t in tokenizer.get("added_tokens", ()))
    return tokenizer.get("model", {}).get("vocab", {}), added
