"""EngineCore: an engine behind typed commands, giving one `CoreOutputs` per turn. One thread owns it.

A turn, as the core's loop (`engine.core.process`) runs it:
1. `apply(command)` for each command that arrived, in order (its immediate results go into the turn's outputs);
2. `turn()`: the KV side's notices (transfers that ended, from the backend's threads) are handled, requests waiting
   for their transfer are admitted (decode pods), one engine step runs if any request is unfinished, the KV side
   ships what the step computed (prefill pods), and the turn's outputs come back with the engine's load.
The KV side is chosen once at construction: `DecodeKV` over a receiver, `PrefillKV` over a sender, or none (a
colocated engine, which runs requests from prompt to end). Nothing here
knows about processes, sockets or gRPC: tests drive a core directly.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from common.errors import PdserveError
from engine.core.commands import (
    AbortRequest,
    AddPrefilledRequest,
    AddRequest,
    Command,
    ReleaseKV,
    ReserveKV,
    Shutdown,
)
from engine.core.decode_kv import DecodeKV
from engine.core.outputs import CoreOutputs, EngineLoad, ErrorInfo, HostTierLoad, RequestFailed
from engine.core.prefill_kv import PrefillKV
from engine.kv_tier.swapper import KVSwapper
from engine.llm_engine import LLMEngine
from engine.scheduler_output import FailedOutput
from kv_transfer.base import KVReceiver, KVSender

KVSide = DecodeKV | PrefillKV
_STEP_EMA = 0.2
"""Weight of the newest step interval in `EngineLoad.step_ms` (about the last ten steps count)."""


class EngineCore:
    """`engine` behind commands; `kv`: the role's KV side (see the module docstring). `wake()` is called (from any
    thread) after a notice arrives, so that an idle loop takes its turn."""

    def __init__(
        self,
        engine: LLMEngine,
        receiver: KVReceiver | None = None,
        sender: KVSender | None = None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.engine = engine
        self._wake = wake
        self._notices: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.kv: KVSide | None = None
        if receiver is not None:
            self.kv = DecodeKV(engine, receiver, self._notify)
        elif sender is not None:
            self.kv = PrefillKV(engine, sender, self._notify)
        self._out = CoreOutputs()
        self.stopped = False
        self._step_ms = 0.0
        self._last_step_ns = 0
        """When the previous turn's step started; 0 when the previous turn ran none."""

    @property
    def busy(self) -> bool:
        """Whether a turn has work now: a step to run, or requests waiting for their transfers."""
        return self.engine.has_unfinished_requests() or (self.kv is not None and self.kv.waiting)

    def apply(self, command: Command) -> None:
        """Apply one command; its immediate results (replies, failures, abort outputs) join the next turn's outputs.
        A pdserve error (bad input, a transfer that cannot go on) fails the command's request, not the core."""
        out = self._out
        try:
            match command:
                case AddRequest(kv_target=None):
                    self.engine.add_request(
                        command.req_id,
                        command.prompt_token_ids,
                        command.params,
                        cache_salt=command.cache_salt,
                        images=command.images,
                    )
                case AddRequest():
                    self._prefill_kv().add(command, out)
                case ReserveKV():
                    self._decode_kv().reserve(command, out)
                case AddPrefilledRequest():
                    self._decode_kv().add_prefilled(command, out)
                case ReleaseKV():
                    self._decode_kv().release(command)
                case AbortRequest(req_id=req_id):
                    if self.kv is not None:
                        self.kv.abort(req_id)
                    out.outputs.extend(self.engine.abort_requests([req_id]))
                case Shutdown():
                    self.stopped = True
        except PdserveError as exc:
            if isinstance(command, Shutdown):
                raise
            out.failures.append(RequestFailed(command.req_id, ErrorInfo.of(exc)))

    def turn(self) -> CoreOutputs:
        """Handle notices, admit what waited, run one step if any request is unfinished; the turn's outputs."""
        out, self._out = self._out, CoreOutputs()
        kv = self.kv
        while True:
            try:
                notice = self._notices.get_nowait()
            except queue.Empty:
                break
            if kv is not None:
                kv.on_notice(notice, out)
        if kv is not None:
            kv.poll(out)
        if self.engine.has_unfinished_requests():
            out.step_started_ns = time.time_ns()
            self._time_step(out.step_started_ns)
            outputs = self.engine.step()
            failed = [o for o in outputs if isinstance(o, FailedOutput)]
            if failed:
                out.failures += [RequestFailed(o.req_id, ErrorInfo.of(o.error)) for o in failed]
                outputs = [o for o in outputs if not isinstance(o, FailedOutput)]
            out.outputs.extend(outputs)
            if isinstance(kv, PrefillKV):
                kv.after_step(out)
            else:
                # NOTE: only prefill pods publish their prefix cache; the events are dropped elsewhere.
                self.engine.kv_cache_manager.take_events()
        else:
            self._last_step_ns = 0
        out.load = self.load()
        return out

    def _time_step(self, started_ns: int) -> None:
        """Fold the time since the previous turn's step started into the moving average (the first step after an
        idle turn only starts the clock)."""
        if self._last_step_ns:
            interval_ms = (started_ns - self._last_step_ns) / 1e6
            self._step_ms = (
                interval_ms if not self._step_ms else (1 - _STEP_EMA) * self._step_ms + _STEP_EMA * interval_ms
            )
        self._last_step_ns = started_ns

    def load(self) -> EngineLoad:
        engine = self.engine
        scheduler, kv_cache, spec = engine.scheduler, engine.kv_cache_manager, engine.spec_stats
        return EngineLoad(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            num_free_blocks=kv_cache.num_free_blocks,
            num_total_blocks=engine.info.num_blocks,
            num_reserved_blocks=self.kv.num_reserved_blocks if isinstance(self.kv, DecodeKV) else 0,
            prefix_cache_queries=kv_cache.stats.queries,
            prefix_cache_hits=kv_cache.stats.hits,
            prefix_cache_host_hits=kv_cache.stats.host_hits,
            num_preemptions=scheduler.num_preemptions,
            spec_draft_tokens=spec.draft_tokens,
            spec_accepted_tokens=spec.accepted_tokens,
            spec_verify_steps=spec.verify_steps,
            queued_prompt_tokens=self._queued_prompt_tokens() if isinstance(self.kv, PrefillKV) else None,
            step_ms=self._step_ms if scheduler.num_running else 0.0,
            host_tier=None if scheduler.swapper is None else self._host_tier_load(scheduler.swapper),
        )

    @staticmethod
    def _host_tier_load(swapper: KVSwapper) -> HostTierLoad:
        host = swapper.host
        return HostTierLoad(
            num_swap_preemptions=swapper.num_swapped_out,
            num_blocks_swapped_out=swapper.num_blocks_swapped_out,
            num_blocks_swapped_in=swapper.num_blocks_swapped_in,
            num_slots=host.num_slots,
            num_swapped_slots=host.num_owned_slots,
            num_cached_slots=host.num_cached,
        )

    def _queued_prompt_tokens(self) -> int:
        scheduler = self.engine.scheduler
        requests = [*scheduler.waiting, *scheduler.running]
        return sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in requests)

    def close(self) -> None:
        """Close the KV side (live transfers end ABORTED)."""
        if self.kv is not None:
            self.kv.close()

    def _notify(self, notice: object) -> None:
        self._notices.put(notice)
        self._wake()

    def _decode_kv(self) -> DecodeKV:
        if not isinstance(self.kv, DecodeKV):
            raise TypeError("a decode command sent to an engine core without a KV receiver")
        return self.kv

    def _prefill_kv(self) -> PrefillKV:
        if not isinstance(self.kv, PrefillKV):
            raise TypeError("a prefill command sent to an engine core without a KV sender")
        return self.kv
