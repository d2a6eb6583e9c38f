"""The engine loop both pod roles and the offline API share: schedule, run, update."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.block_hash import block_extra_keys
from common.errors import InvalidArgumentError
from common.multimodal import ImageInput
from common.sampling_params import SamplingParams
from engine.beam.beam_checks import check_beam_search
from engine.beam.beam_search import BeamSearch
from engine.config import EngineConfig
from engine.executor import PendingResult, make_executor
from engine.kv_tier.setup import make_kv_cache
from engine.model_runner import ModelRunner
from engine.model_store import resolve_model
from engine.multimodal.features import ImageFeature
from engine.multimodal.image_inputs import ImageInputs
from engine.request import Request
from engine.runtime_info import RuntimeInfo
from engine.scheduler import Scheduler
from engine.scheduler_output import EngineOutput, RunnerOutput, SchedulerOutput
from engine.spec.config import DRAFT_METHODS, SpeculativeConfig
from engine.spec.draft_runner import load_draft_runner
from engine.spec.draft_speculator import draft_speculator
from engine.spec.ngram import NgramProposer
from engine.spec.proposer import Proposer
from engine.spec.replay import ReplayProposer
from engine.spec.speculator import Speculator
from engine.spec.stats import SpecStats
from kv_transfer.layout import KVRank
from kv_transfer.pool_view import KVPoolView

logger = logging.getLogger(__name__)


def _eos_token_ids(folder: Path, from_config: tuple[int, ...]) -> tuple[int, ...]:
    path = folder / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
    extra = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    return tuple(dict.fromkeys([*from_config, *extra]))


def _speculator(config: SpeculativeConfig | None, async_scheduling: bool) -> Speculator | None:
    if config is None:
        return None
    assert config.method not in DRAFT_METHODS, "a draft model's speculator is built by draft_speculator"
    proposer: Proposer
    if config.method == "replay":
        proposer = ReplayProposer(config.replay_corruption)
    else:
        proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    return Speculator(config, proposer, back_off=async_scheduling)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_path = resolve_model(config.model.model)
        spec = config.speculative_config
        # NOTE: the draft's weights load first, so that the target's KV pool budget counts them as used.
        draft = None if spec is None or spec.method not in DRAFT_METHODS else load_draft_runner(config, self.model_path)
        self.executor = make_executor(config, self.model_path, 0 if draft is None else draft.block_nbytes)
        arch = self.executor.arch
        self.info = RuntimeInfo(
            model_id=config.model.model,
            device=str(self.executor.device),
            dtype=str(self.executor.dtype).removeprefix("torch."),
            num_blocks=self.executor.num_blocks,
            block_size=config.cache.block_size,
            max_model_len=self.executor.max_model_len,
            vocab_size=arch.vocab_size,
            eos_token_ids=_eos_token_ids(self.model_path, arch.eos_token_ids),
        )
        self.kv_cache_manager, swapper = make_kv_cache(config, self.executor)
        configured = config.scheduler.async_scheduling
        if configured is None:
            configured = self.executor.device.type == "cuda" and config.parallel.pipeline_parallel_size == 1
        self.async_scheduling = configured
        self.speculator = (
            _speculator(spec, self.async_scheduling)
            if draft is None or spec is None
            else draft_speculator(
                spec,
                draft,
                self.runner,
                self.kv_cache_manager,
                config.scheduler.max_num_batched_tokens,
                self.async_scheduling,
            )
        )
        self.scheduler = Scheduler(
            config.scheduler.for_device(self.executor.device.type),
            self.kv_cache_manager,
            self.executor.max_model_len,
            self.speculator,
            swapper,
        )
        self.beams = BeamSearch(self.scheduler, self.kv_cache_manager)
        self._pending: tuple[SchedulerOutput, PendingResult] | None = None
        self.image_inputs = ImageInputs.from_folder(self.model_path)

    @property
    def runner(self) -> ModelRunner:
        """The in-process model runner of a single-device engine (a parallel engine's model lives in workers)."""
        assert isinstance(self.executor, ModelRunner), "a parallel engine runs its model in worker processes"
        return self.executor

    @property
    def spec_stats(self) -> SpecStats:
        """Cumulative speculative decoding counters (all zero with speculation off)."""
        return SpecStats() if self.speculator is None else self.speculator.stats

    def set_replay_recordings(self, recordings: Mapping[tuple[int, ...], Sequence[int]]) -> None:
        """The replay proposer's recordings: prompt token ids -> their greedy output (see engine.spec.replay)."""
        proposer = None if self.speculator is None else self.speculator.proposer
        if not isinstance(proposer, ReplayProposer):
            raise InvalidArgumentError("speculative_config.method", "recordings need the replay method")
        proposer.record(recordings)

    def kv_pool_views(self) -> list[KVPoolView]:
        """Each rank's KV pool in rank order, for the KV transfer backends (a parallel engine's are shared with its
        workers)."""
        tp_size, pp_size = self.config.parallel.tensor_parallel_size, self.config.parallel.pipeline_parallel_size
        pools = zip(self.executor.kv_pools, self.executor.kv_pool_handles, strict=True)
        return [
            KVPoolView(pool, self.info.block_size, KVRank.of_world_rank(world_rank, tp_size, pp_size), handle)
            for world_rank, (pool, handle) in enumerate(pools)
        ]

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise InvalidArgumentError naming the field for input the engine cannot serve."""
        self.info.validate(prompt_token_ids, params)
        check_beam_search(params, self.config.scheduler, self.speculator is not None)

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        hold_kv: bool = False,
        cache_salt: str | None = None,
        images: Sequence[ImageInput] = (),
    ) -> None:
        """Queue a request. With `hold_kv` (prefill pods) its blocks outlive it until `release_kv`. A `cache_salt`
        keys its prefix cache blocks instead of the engine's --cache-salt: it shares blocks only with that salt.
        `images` (a vision-language model's) fill their placeholders in the prompt."""
        self.validate(prompt_token_ids, params)
        self._check_new_id(req_id)
        extra_keys = None if cache_salt is None else block_extra_keys(self.config.model.model, cache_salt)
        features = self._image_features(prompt_token_ids, images) if images else ()
        request = Request(
            req_id,
            prompt_token_ids,
            params,
            self.info.eos_token_ids,
            hold_kv=hold_kv,
            block_extra_keys=extra_keys,
            mm_features=features,
        )
        self.scheduler.add_request(self.beams.add(request) if params.use_beam_search else request)

    def _image_features(self, prompt_token_ids: list[int], images: Sequence[ImageInput]) -> tuple[ImageFeature, ...]:
        if self.image_inputs is None:
            raise InvalidArgumentError("images", f"{self.config.model.model} takes no image inputs")
        return self.image_inputs.features(prompt_token_ids, images)

    def _check_new_id(self, req_id: str) -> None:
        if req_id in self.scheduler.requests or req_id in self.scheduler.held_kv:
            raise InvalidArgumentError("request_id", f"{req_id!r} is already in use")

    def reserve_kv(self, req_id: str, num_tokens: int) -> list[int] | None:
        """Decode pods: allocate blocks for `num_tokens` of prompt KV that will arrive from a prefill pod.

        Returns the block ids, or None when the pool cannot supply them now.
        """
        self._check_new_id(req_id)
        if self.kv_cache_manager.get_block_ids(req_id):
            raise InvalidArgumentError("request_id", f"{req_id!r} already holds reserved blocks")
        return self.kv_cache_manager.allocate_slots(req_id, num_tokens)

    def add_prefilled_request(
        self, req_id: str, prompt_token_ids: list[int], first_token_id: int, params: SamplingParams
    ) -> None:
        """Decode pods: admit a request whose prompt KV has arrived in its reserved blocks."""
        self.validate(prompt_token_ids, params)
        num_blocks = len(self.kv_cache_manager.get_block_ids(req_id))
        if num_blocks * self.info.block_size < len(prompt_token_ids):
            raise InvalidArgumentError(
                "request_id",
                f"{req_id!r} has {num_blocks} reserved blocks, too few for {len(prompt_token_ids)} prompt tokens",
            )
        recomputable = not self._has_image_placeholders(prompt_token_ids)
        # NOTE: an image prompt's blocks are keyed by the request: without its images' hashes, equal placeholders
        # must not share KV (a swapped-out request finds only its own blocks again).
        extra_keys = None if recomputable else block_extra_keys(self.config.model.model, f"prefilled image {req_id}")
        if params.use_beam_search:
            # NOTE: the beams start from the prompt's last logits: its last token is computed again, over the KV that
            # arrived; the prefill pod's first token is not used.
            request = Request(
                req_id,
                prompt_token_ids,
                params,
                self.info.eos_token_ids,
                block_extra_keys=extra_keys,
                recomputable=recomputable,
            )
            first_beam = self.beams.add(request)
            first_beam.num_computed_tokens = len(prompt_token_ids) - 1
            self.scheduler.add_request(first_beam)
            return
        self.scheduler.add_request(
            Request.prefilled(
                req_id, prompt_token_ids, first_token_id, params, self.info.eos_token_ids, extra_keys, recomputable
            )
        )

    def _has_image_placeholders(self, prompt_token_ids: list[int]) -> bool:
        """Whether a prefilled prompt holds image placeholders: their KV came with the images, which stayed on the
        prefill pod. NOTE: a text prompt that spells the image token counts too; it is only ever swapped, never
        recomputed, which is safe."""
        if self.image_inputs is None:
            return False
        return self.image_inputs.config.image_token_id in prompt_token_ids

    def release_kv(self, req_id: str) -> None:
        """Free the blocks a finished prefill request held or a decode reservation took (a running request's once it
        finishes)."""
        self.scheduler.release_kv(req_id)

    def kv_progress(self, req_id: str) -> tuple[list[int], int] | None:
        """(block ids, tokens whose KV is computed) of a running or held request, None if unknown."""
        return self.scheduler.kv_progress(req_id)

    def abort_requests(self, req_ids: list[str]) -> list[EngineOutput]:
        outputs, others = self.beams.abort(req_ids)
        return outputs + self.scheduler.abort_requests(others)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._pending is not None

    def step(self) -> list[EngineOutput]:
        """Schedule and run one step. With async scheduling the outputs returned are the previous step's: this
        step is enqueued on the device first, then the host waits for the previous one's tokens."""
        if not self.async_scheduling:
            scheduler_output = self.scheduler.schedule()
            return self._update(scheduler_output, self.executor.execute(scheduler_output).result())
        outputs: list[EngineOutput] = []
        if self._pending is not None and (self._needs_output_history() or self._must_see_tokens()):
            outputs = self._apply_pending()
        scheduler_output = self.scheduler.schedule()
        pending = self.executor.execute(scheduler_output)
        if self._pending is not None:
            outputs += self._apply_pending()
        if scheduler_output.scheduled:
            self._pending = (scheduler_output, pending)
        else:
            outputs += self._update(scheduler_output, pending.result())
        return outputs

    def _apply_pending(self) -> list[EngineOutput]:
        assert self._pending is not None
        (scheduler_output, pending), self._pending = self._pending, None
        return self._update(scheduler_output, pending.result())

    def _update(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> list[EngineOutput]:
        outputs = self.beams.end_failed(self.scheduler.update_from_output(scheduler_output, runner_output))
        if runner_output.beam_candidates:
            outputs += self.beams.update(runner_output.beam_candidates)
        return outputs

    def _must_see_tokens(self) -> bool:
        """Proposals follow from every token so far, and a step that verified some changes what is computed: such
        steps wait for the step in flight (no async overlap while speculating)."""
        if self.speculator is None or self._pending is None:
            return False
        return any(r.draft_token_ids for r in self._pending[0].scheduled) or self.speculator.wants_to_propose(
            self.scheduler.running
        )

    def _needs_output_history(self) -> bool:
        """Penalties read every output token, and beams are chosen from every beam's step: such a batch waits for the
        step in flight before it is scheduled."""
        return any(r.sampling_params.has_penalty or r.sampling_params.use_beam_search for r in self.scheduler.running)
