"""The colocated baseline: this project's engine without disaggregation, in an engine core process of its own.

`ColocatedTarget.open(...)` starts a colocated engine core (`engine.core`, as inside a pod, with no KV transfer end)
configured by the pods' engine flags; the benchmark's event loop submits requests on the same schedules it uses
against the router and stamps each output as it reaches the loop, as a client of the router would. Prefill and
decode share the engine's batches (chunked prefill), which is what disaggregation is compared against. Closing it
ends the process, so the GPU memory is free for the cluster's pods that start next.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from bench.online.load_driver import RequestRecord
from bench.reporting.stats import RequestTiming
from bench.workloads import RequestSpec
from common.config import add_config_args
from common.errors import PdserveError
from common.sampling_params import SamplingParams
from engine.config import ENGINE_FLAG_PARTS, EngineConfig, engine_config_from_args
from engine.core.client import EngineCoreClient
from engine.core.commands import AbortRequest, AddRequest
from engine.core.messages import CoreSpec
from engine.core.outputs import CoreOutputs
from engine.runtime_info import RuntimeInfo
from engine.scheduler_output import EngineOutput


def engine_config(model: str, load_format: str, engine_flags: Sequence[str]) -> EngineConfig:
    """The engine flags among `engine_flags` (the pods' flags; others, such as --heartbeat-s, are skipped)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for cls in ENGINE_FLAG_PARTS:
        add_config_args(parser, cls)
    args, _ = parser.parse_known_args(list(engine_flags))
    args.model, args.load_format = model, load_format
    return engine_config_from_args(args)


class ColocatedTarget:
    """Streams requests through a colocated engine core; see the module docstring."""

    def __init__(self, client: EngineCoreClient, info: RuntimeInfo) -> None:
        self.info = info
        self._client = client
        self._streams: dict[str, asyncio.Queue[EngineOutput | PdserveError]] = {}
        client.attach(self._on_outputs, self._on_dead)

    @classmethod
    @asynccontextmanager
    async def open(cls, model: str, load_format: str, engine_flags: Sequence[str]) -> AsyncIterator[ColocatedTarget]:
        """The engine runs with the very settings the pods run with; its process ends on exit."""
        client = EngineCoreClient(CoreSpec("colocated", engine_config(model, load_format, engine_flags)))
        try:
            ready = await client.start()
            yield cls(client, ready.info)
        finally:
            await client.close()

    async def generate(self, spec: RequestSpec, request_id: str) -> RequestRecord:
        params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)
        prompt = list(spec.prompt_token_ids)
        record = RequestRecord(RequestTiming(time.monotonic()), num_prompt_tokens=len(prompt))
        stream = self._streams[request_id] = asyncio.Queue()
        finished = False
        try:
            self._client.send(AddRequest(request_id, prompt, params))
            while not finished:
                output = await stream.get()
                if isinstance(output, PdserveError):
                    raise output
                now = time.monotonic()
                record.timing.token_times.extend(now for _ in output.new_token_ids)
                record.num_cached_tokens = output.num_cached_tokens
                finished = output.finish_reason is not None
        except PdserveError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            del self._streams[request_id]
            if not finished and not self._client.failed:
                self._client.send(AbortRequest(request_id))
        return record

    def _on_outputs(self, out: CoreOutputs) -> None:
        for failure in out.failures:
            stream = self._streams.get(failure.req_id)
            if stream is not None:
                stream.put_nowait(failure.error.to_error())
        for output in out.outputs:
            stream = self._streams.get(output.req_id)
            if stream is not None:
                stream.put_nowait(output)

    def _on_dead(self, error: PdserveError) -> None:
        for stream in self._streams.values():
            stream.put_nowait(error)
