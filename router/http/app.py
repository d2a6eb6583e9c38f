"""The HTTP routes, over the router's `RequestLifecycle` (the gRPC API's own request path).

- POST /v1/completions, POST /v1/chat/completions: `stream` true answers server-sent events (`router.http.streaming`),
  false one JSON body; `x-request-id` becomes the request id (traces and Abort), else one is made;
- GET /v1/models, GET /health (200 serving; 503 `{"status": "draining"}`, or `{"status": "no pods"}` with the live
  pods of each role until a live prefill pod and a live decode pod were seen), GET /metrics (the router's Prometheus
  registry);
- POST /tokenize (`prompt` or `messages`) and /detokenize (`tokens`), in vLLM's shapes.
With bearer tokens configured, every route but /health and /metrics needs `Authorization: Bearer <token>`
(common.auth.TokenAuthenticator, the gRPC API's tokens): 401 without one, 403 with a wrong one.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from transformers import PreTrainedTokenizerBase

from common.auth import TokenAuthenticator
from common.errors import InvalidArgumentError
from router.admission.admission import client_id
from router.completion.request_lifecycle import GenerateInput, RequestLifecycle
from router.config import RouterConfig
from router.http import protocol
from router.http.errors import HttpError, http_error
from router.http.image_urls import RemoteImages
from router.http.protocol import CompletionBodies, Endpoint
from router.http.streaming import DisconnectWatcher, SseResponse
from router.outputs import CompletionChunk, Usage
from router.server_status import ServerStatus

REQUEST_ID_HEADER = "x-request-id"
_OPEN_PATHS = ("/health", "/metrics")


def error_response(error: HttpError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


class HttpApi:
    """The routes' handlers; `authenticator` None: no auth."""

    def __init__(
        self,
        lifecycle: RequestLifecycle,
        status: ServerStatus,
        tokenizer: PreTrainedTokenizerBase,
        registry: CollectorRegistry,
        authenticator: TokenAuthenticator | None = None,
        remote_images: RemoteImages | None = None,
    ) -> None:
        """`registry`: the router's Prometheus metrics, served on /metrics; `remote_images`: fetches http(s) image
        URLs (default: off, as RouterConfig's)."""
        self._lifecycle = lifecycle
        self._registry = registry
        self._status = status
        self._tokenizer = tokenizer
        self._authenticator = authenticator
        self._remote_images = remote_images or RemoteImages(RouterConfig())

    def app(self) -> Starlette:
        routes = [
            Route("/v1/completions", self._guarded(self.completions), methods=["POST"]),
            Route("/v1/chat/completions", self._guarded(self.chat_completions), methods=["POST"]),
            Route("/v1/models", self._guarded(self.models), methods=["GET"]),
            Route("/tokenize", self._guarded(self.tokenize), methods=["POST"]),
            Route("/detokenize", self._guarded(self.detokenize), methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
        return Starlette(routes=routes)

    def _guarded(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """`handler` behind bearer auth, its errors answered as OpenAI errors."""

        async def guarded(request: Request) -> Response:
            try:
                if self._authenticator is not None:
                    self._authenticator.check(request.url.path, request.headers.get("authorization"))
                return await handler(request)
            except Exception as exc:
                return error_response(http_error(exc))

        return guarded

    async def completions(self, request: Request) -> Response:
        body = await _json_body(request)
        call = protocol.completion_input(body, _request_id(request), _client(request))
        return await self._generate(request, body, call, "completions")

    async def chat_completions(self, request: Request) -> Response:
        body = await _json_body(request)
        rid, client = _request_id(request), _client(request)
        messages = protocol.chat_messages(body, await self._remote_images.fetch(body))
        token_ids = None
        if protocol.needs_default_max_tokens(body):
            token_ids = await self._lifecycle.tokenize(None, messages)
        call = protocol.chat_input(body, rid, client, token_ids, self._lifecycle.model.max_model_len, messages)
        return await self._generate(request, body, call, "chat")

    async def _generate(
        self, request: Request, body: dict[str, Any], call: GenerateInput, endpoint: Endpoint
    ) -> Response:
        stream = _flag(body, "stream")
        options = body.get("stream_options") or {}
        include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
        bodies = CompletionBodies(endpoint, call.request_id, self._lifecycle.model.model_id)
        headers = {REQUEST_ID_HEADER: call.request_id}
        chunks = self._lifecycle.generate(call, None)
        watcher = DisconnectWatcher(request.receive)
        try:
            first = await anext(chunks)
            if stream:
                return SseResponse(first, chunks, bodies, watcher, include_usage, headers)
            texts, finishes, usage = await _collect(first, chunks)
        except asyncio.CancelledError:
            await chunks.aclose()
            if not watcher.absorb():
                raise
            return error_response(HttpError(499, "request aborted", code="CANCELLED"))
        except Exception:
            watcher.stop()
            await chunks.aclose()
            raise
        watcher.stop()
        return JSONResponse(bodies.response(texts, finishes, usage), headers=headers)

    async def models(self, request: Request) -> Response:
        model_id = self._lifecycle.model.model_id
        card = {
            "id": model_id,
            "object": "model",
            "created": 0,
            "owned_by": "pdserve",
            "root": model_id,
            "max_model_len": self._lifecycle.model.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def tokenize(self, request: Request) -> Response:
        body = await _json_body(request)
        if "messages" in body:
            messages = protocol.chat_messages(body, await self._remote_images.fetch(body))
            token_ids = await self._lifecycle.tokenize(None, messages)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise InvalidArgumentError("prompt", "must be a string (or send messages)")
            token_ids = await self._lifecycle.tokenize(prompt, None)
        model = self._lifecycle.model
        return JSONResponse({"tokens": token_ids, "count": len(token_ids), "max_model_len": model.max_model_len})

    async def detokenize(self, request: Request) -> Response:
        body = await _json_body(request)
        tokens = body.get("tokens")
        vocab_size = self._lifecycle.model.vocab_size
        if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < vocab_size for t in tokens):
            raise InvalidArgumentError("tokens", f"must be a list of token ids in [0, {vocab_size})")
        return JSONResponse({"prompt": self._tokenizer.decode(tokens)})

    async def health(self, request: Request) -> Response:
        if self._status.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not self._status.serving:
            live = {f"num_{role}_pods": self._status.num_serving_pods(role) for role in ("prefill", "decode")}
            return JSONResponse({"status": "no pods", **live}, status_code=503)
        return JSONResponse({"status": "serving"})

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self._registry), media_type=CONTENT_TYPE_LATEST)


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError("body", f"is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidArgumentError("body", "must be a JSON object")
    return body


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool) and value is not None:
        raise InvalidArgumentError(name, "must be a boolean")
    return bool(value)


def _request_id(request: Request) -> str:
    return request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex


def _client(request: Request) -> str:
    peer = f"{request.client.host}:{request.client.port}" if request.client else ""
    return client_id(request.headers.items(), peer)


async def _collect(
    first: CompletionChunk, chunks: AsyncGenerator[CompletionChunk, None]
) -> tuple[dict[int, str], dict[int, CompletionChunk], Usage]:
    """The rest of a stream: each completion's text, its last chunk, and the usage."""
    texts: dict[int, list[str]] = {}
    finishes: dict[int, CompletionChunk] = {}
    usage = None
    chunk: CompletionChunk | None = first
    while chunk is not None:
        texts.setdefault(chunk.index, []).append(chunk.text)
        if chunk.finish_reason is not None:
            finishes[chunk.index] = chunk
        usage = chunk.usage or usage
        chunk = await anext(chunks, None)
    assert usage is not None, "a finished stream carries its usage"
    return {index: "".join(parts) for index, parts in texts.items()}, finishes, usage
