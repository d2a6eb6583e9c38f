"""OpenAI (and vLLM) JSON bodies <-> the lifecycle's values, at the HTTP boundary only.

Requests: `completion_input` and `chat_input` read a /v1/completions or /v1/chat/completions body into a
`GenerateInput`, checking each field's JSON type (InvalidArgumentError naming it). Sampling fields keep vLLM's
names and meanings (temperature, top_p, top_k, min_p, seed, repetition_penalty, presence/frequency_penalty,
max_tokens, stop, stop_token_ids, ignore_eos, include_stop_str_in_output, n, best_of, and beam search's
use_beam_search, length_penalty, early_stopping: its temperature defaults to 0); fields the engine cannot honour
(min_tokens > 0, logprobs, echo, suffix, logit_bias, tools) are refused by name rather than ignored.
Responses: `CompletionBodies` turns chunks into response bodies, streaming chunk bodies and the usage.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from router.completion.request_lifecycle import GenerateInput
from router.http.image_urls import image_bytes, part_url
from router.outputs import CompletionChunk, Usage
from router.tokenizer.tokenizer_pool import ChatMessage

Endpoint = Literal["completions", "chat"]
_REFUSED = ("logprobs", "top_logprobs", "echo", "suffix", "logit_bias", "tools", "functions", "min_tokens")
"""Fields accepted only at their neutral value (null, false, 0, empty)."""


def _typed(body: Mapping[str, Any], name: str, kinds: tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    # NOTE: bool is an int in Python; JSON true is no number.
    if value is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
        raise InvalidArgumentError(name, f"must be {what}, got {type(value).__name__}")
    return value


def _int(body: Mapping[str, Any], name: str) -> int | None:
    value: int | None = _typed(body, name, (int,), "an integer")
    return value


def _float(body: Mapping[str, Any], name: str) -> float | None:
    value: int | float | None = _typed(body, name, (int, float), "a number")
    return None if value is None else float(value)


def _bool(body: Mapping[str, Any], name: str) -> bool:
    return bool(_typed(body, name, (bool,), "a boolean"))


def sampling_params(body: Mapping[str, Any], default_max_tokens: int | None) -> SamplingParams:
    """The sampling fields of a request body; `max_tokens` (or chat's `max_completion_tokens`) defaults to
    `default_max_tokens` (None: SamplingParams' default)."""
    for name in _REFUSED:
        if body.get(name):
            raise InvalidArgumentError(name, "is not supported by this server")
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise InvalidArgumentError("stop", "must be a string or a list of strings")
    stop_token_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_token_ids, list) or not all(isinstance(t, int) for t in stop_token_ids):
        raise InvalidArgumentError("stop_token_ids", "must be a list of integers")
    use_beam_search = _bool(body, "use_beam_search")
    temperature = _float(body, "temperature")
    if use_beam_search and temperature is None:
        temperature = 0.0
    early_stopping = body.get("early_stopping")
    if early_stopping is not None and early_stopping not in (True, False, "never"):
        raise InvalidArgumentError("early_stopping", 'must be true, false or "never"')
    max_tokens = _int(body, "max_completion_tokens") if body.get("max_tokens") is None else _int(body, "max_tokens")
    fields: dict[str, Any] = {
        "n": _int(body, "n"),
        "best_of": _int(body, "best_of"),
        "use_beam_search": use_beam_search or None,
        "length_penalty": _float(body, "length_penalty"),
        "early_stopping": early_stopping,
        "temperature": temperature,
        "top_p": _float(body, "top_p"),
        "top_k": _int(body, "top_k"),
        "min_p": _float(body, "min_p"),
        "seed": _int(body, "seed"),
        "repetition_penalty": _float(body, "repetition_penalty"),
        "presence_penalty": _float(body, "presence_penalty"),
        "frequency_penalty": _float(body, "frequency_penalty"),
        "max_tokens": max_tokens if max_tokens is not None else default_max_tokens,
        "stop": stop,
        "stop_token_ids": tuple(stop_token_ids),
        "ignore_eos": _bool(body, "ignore_eos") or None,
        "include_stop_str_in_output": _bool(body, "include_stop_str_in_output") or None,
    }
    # NOTE: top_k 0 means "off" in vLLM's OpenAI server as -1 does.
    if fields["top_k"] == 0:
        fields["top_k"] = -1
    return SamplingParams(**{name: value for name, value in fields.items() if value is not None})


def completion_input(body: Mapping[str, Any], request_id: str, client_id: str) -> GenerateInput:
    """A /v1/completions body: `prompt` is a string, a list of one string, or a list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        token_ids = tuple(prompt)
    else:
        raise InvalidArgumentError("prompt", "must be a string, a list of one string, or a list of token ids")
    return GenerateInput(
        request_id,
        sampling_params(body, None),
        text=text,
        token_ids=token_ids,
        cache_salt=_salt(body),
        client_id=client_id,
    )


def chat_messages(body: Mapping[str, Any], fetched: Mapping[str, bytes] | None = None) -> tuple[ChatMessage, ...]:
    """`messages`: objects with a string `role` and a `content` that is a string or a list of text and image_url
    parts (data: URLs, or remote ones as `fetched` holds them: `router.http.image_urls`)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages", "must be a non-empty list of messages")
    parsed = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(role, str):
            raise InvalidArgumentError(f"messages[{i}].role", "must be a string")
        if isinstance(content, list):
            parts = _content_parts(i, content, fetched or {})
            if any(isinstance(p, bytes) for p in parts):
                parsed.append(ChatMessage(role, "", parts))
                continue
            content = "".join(p for p in parts if isinstance(p, str))
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise InvalidArgumentError(f"messages[{i}].content", "must be a string or a list of text parts")
        parsed.append(ChatMessage(role, content))
    return tuple(parsed)


def _content_parts(index: int, content: list[Any], fetched: Mapping[str, bytes]) -> tuple[str | bytes, ...]:
    parts: list[str | bytes] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        field = f"messages[{index}].content[{j}]"
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "image_url" and (url := part_url(part)) is not None:
            parts.append(image_bytes(url, f"{field}.image_url", fetched))
        else:
            raise InvalidArgumentError(field, "must be a text part or an image_url part with a url")
    return tuple(parts)


def chat_input(
    body: Mapping[str, Any],
    request_id: str,
    client_id: str,
    token_ids: list[int] | None,
    max_model_len: int,
    messages: tuple[ChatMessage, ...] | None = None,
) -> GenerateInput:
    """A /v1/chat/completions body; `token_ids`: its messages already tokenized (to default `max_tokens` to what
    max_model_len leaves, as vLLM does), else None; `messages`: the body's, parsed already (default: parsed here).
    The messages go to the lifecycle as they are unless they were tokenized and hold no image."""
    default_max_tokens = None if token_ids is None else max(max_model_len - len(token_ids), 1)
    params = sampling_params(body, default_max_tokens)
    messages = chat_messages(body) if messages is None else messages
    if token_ids is not None and not any(m.parts for m in messages):
        return GenerateInput(
            request_id, params, token_ids=tuple(token_ids), cache_salt=_salt(body), client_id=client_id
        )
    return GenerateInput(request_id, params, messages=messages, cache_salt=_salt(body), client_id=client_id)


def needs_default_max_tokens(body: Mapping[str, Any]) -> bool:
    return body.get("max_tokens") is None and body.get("max_completion_tokens") is None


def _salt(body: Mapping[str, Any]) -> str | None:
    salt: str | None = _typed(body, "cache_salt", (str,), "a string")
    return salt


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


@dataclass(slots=True)
class CompletionBodies:
    """The response bodies of one request (`endpoint`), for model `model_id`."""

    endpoint: Endpoint
    request_id: str
    model_id: str
    created: int = 0

    def __post_init__(self) -> None:
        self.created = self.created or int(time.time())

    @property
    def response_id(self) -> str:
        return f"{'chatcmpl' if self.endpoint == 'chat' else 'cmpl'}-{self.request_id}"

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": kind,
            "created": self.created,
            "model": self.model_id,
            "choices": choices,
        }

    def response(
        self, texts: Mapping[int, str], finishes: Mapping[int, CompletionChunk], usage: Usage
    ) -> dict[str, Any]:
        """The non-streaming body: each completion's whole text, its finish, and the usage."""
        choices = []
        for index in sorted(texts):
            last = finishes[index]
            choice: dict[str, Any] = {
                "index": index,
                "logprobs": None,
                "finish_reason": last.finish_reason,
                "stop_reason": last.stop_reason,
            }
            if self.endpoint == "chat":
                choice["message"] = {"role": "assistant", "content": texts[index]}
            else:
                choice["text"] = texts[index]
            choices.append(choice)
        kind = "chat.completion" if self.endpoint == "chat" else "text_completion"
        return {**self._envelope(kind, choices), "usage": usage_body(usage)}

    def chunk(self, chunk: CompletionChunk, first: bool, include_usage: bool) -> dict[str, Any]:
        """A streaming chunk body of `chunk`; `first`: the completion's first chunk (chat announces the role)."""
        choice: dict[str, Any] = {
            "index": chunk.index,
            "logprobs": None,
            "finish_reason": chunk.finish_reason,
            "stop_reason": chunk.stop_reason,
        }
        if self.endpoint == "chat":
            choice["delta"] = {"role": "assistant", "content": chunk.text} if first else {"content": chunk.text}
        else:
            choice["text"] = chunk.text
        kind = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        body = self._envelope(kind, [choice])
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last streaming chunk when `stream_options.include_usage` is set: no choices, the usage."""
        kind = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return {**self._envelope(kind, []), "usage": usage_body(usage)}
