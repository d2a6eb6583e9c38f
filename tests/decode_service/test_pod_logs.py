"""Each pod logs one line, with the request id, the transfer id and the state, when a transfer expires, fails or a
request is aborted."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc.aio
import pytest

from cli.redis_server import RedisServer
from pdserve.v1 import prefill_pb2, sampling_pb2
from tests.decode_service.pod_pair import DECODE_ID, read_all, running_pods

pytestmark = pytest.mark.anyio

PROMPT = [(3 * i + 2) % 512 for i in range(40)]
PARAMS = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


def _lines(caplog: pytest.LogCaptureFixture, logger: str, transfer_id: str) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name.startswith(logger) and transfer_id in r.getMessage()
    ]


async def test_expired_failed_and_aborted_are_logged(
    tiny_model: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_pods(tiny_model, redis_server.url, decode_flags=["--kv-lease-s", "0.3"]) as pods:
        expiring = (await pods.reserve(PROMPT, 4)).kv_target.transfer_id
        await pods.wait_for_pod(DECODE_ID, lambda info: info is not None and info.num_free_blocks == 61, 1.0)
        await pods.wait_for_pod(DECODE_ID, lambda info: info is not None and info.num_free_blocks == 64, 2.0)
        assert _lines(caplog, "decode_service.decode_front", expiring) == [
            (
                logging.WARNING,
                f"KV reservation of request 'req' (transfer {expiring}) ended expired before its "
                "claim; its blocks are freed",
            ),
        ]

        released = await pods.reserve(PROMPT, 4)
        await pods.release(released)
        with pytest.raises(grpc.aio.AioRpcError):
            await read_all(pods.start_prefill(PROMPT, PARAMS, released))
        lines = _lines(caplog, "prefill_service.", released.kv_target.transfer_id)
        assert [level for level, _ in lines] == [logging.WARNING, logging.INFO]
        assert "of request 'req' ended aborted" in lines[0][1] or "of request 'req' ended failed" in lines[0][1]
        assert lines[1][1].endswith("ended early: failed")

        reserve = await pods.reserve(PROMPT, 200)
        first = await pods.start_prefill(PROMPT, PARAMS, reserve).read()
        assert isinstance(first, prefill_pb2.PrefillResponse)
        decode_call = pods.start_decode(PROMPT, PARAMS, reserve, first.first_token.token_id)
        await decode_call.read()
        decode_call.cancel()
        await pods.wait_until_idle()
        await asyncio.sleep(0.05)
        assert _lines(caplog, "decode_service.decode_front", reserve.kv_target.transfer_id) == [
            (logging.INFO, f"decode of request 'req' (transfer {reserve.kv_target.transfer_id}) ended early: cancelled")
        ]
