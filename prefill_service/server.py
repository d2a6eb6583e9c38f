"""The PrefillService gRPC servicer: protobuf in, PrefillFront, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc.aio

from common.errors import UnavailableError
from common.multimodal import ImageInput
from common.proto_convert import sampling_params_from_pb
from kv_transfer.state import TransferError
from pdserve.v1 import prefill_pb2, prefill_pb2_grpc
from prefill_service.convert import prefill_event_to_pb, request_kv_target
from prefill_service.prefill_front import PrefillFront

SERVICE_NAME = "pdserve.v1.PrefillService"

Context = grpc.aio.ServicerContext[Any, Any]


class PrefillServicer(prefill_pb2_grpc.PrefillServiceServicer):
    """Thin servicer; `front` is set once the engine has loaded (UNAVAILABLE before)."""

    def __init__(self) -> None:
        self.front: PrefillFront | None = None

    async def Prefill(
        self, request: prefill_pb2.PrefillRequest, context: Context
    ) -> AsyncIterator[prefill_pb2.PrefillResponse]:
        if self.front is None:
            raise UnavailableError("prefill pod is still loading")
        params = sampling_params_from_pb(request.sampling_params, max_n=1)
        target = request_kv_target(request)
        cache_salt = request.cache_salt if request.HasField("cache_salt") else None
        images = tuple(ImageInput.of(i.data, i.offset, i.num_tokens) for i in request.images)
        events = self.front.prefill(
            list(request.prompt_token_ids), params, target, cache_salt, request.request_id, images
        )
        try:
            async for event in events:
                yield prefill_event_to_pb(event)
        except TransferError as exc:
            raise exc.for_request(request.request_id) from exc
