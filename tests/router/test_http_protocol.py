"""The HTTP boundary's conversions, exactly: JSON bodies -> GenerateInput, chunks -> OpenAI bodies, errors -> HTTP."""

from __future__ import annotations

import asyncio

import pytest

from common.auth import PermissionDeniedError, UnauthenticatedError
from common.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from common.sampling_params import SamplingParams
from router.completion.request_lifecycle import GenerateInput
from router.completion.running_requests import AbortResult, RunningRequests
from router.http.errors import http_error
from router.http.protocol import CompletionBodies, chat_input, completion_input, sampling_params
from router.outputs import CompletionChunk, Usage
from router.tokenizer.tokenizer_pool import ChatMessage


def test_completion_body_with_vllm_extensions() -> None:
    body = {
        "model": "m",
        "prompt": "Hello",
        "max_tokens": 7,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 3,
        "seed": 11,
        "repetition_penalty": 1.1,
        "stop": "\n",
        "stop_token_ids": [2],
        "ignore_eos": True,
        "n": 2,
        "presence_penalty": 0.5,
        "min_tokens": 0,
        "cache_salt": "s",
    }
    assert completion_input(body, "r1", "c1") == GenerateInput(
        request_id="r1",
        params=SamplingParams(
            n=2,
            temperature=0.0,
            top_k=3,
            top_p=0.5,
            seed=11,
            repetition_penalty=1.1,
            presence_penalty=0.5,
            max_tokens=7,
            stop=("\n",),
            stop_token_ids=(2,),
            ignore_eos=True,
        ),
        text="Hello",
        cache_salt="s",
        client_id="c1",
    )


def test_completion_prompt_forms() -> None:
    assert completion_input({"prompt": ["Hi"]}, "r", "c").text == "Hi"
    assert completion_input({"prompt": [1, 2, 3]}, "r", "c").token_ids == (1, 2, 3)
    assert completion_input({"prompt": [[4, 5]]}, "r", "c").token_ids == (4, 5)
    assert completion_input({"prompt": "x"}, "r", "c").params == SamplingParams()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "x", "max_tokens": "7"}, "max_tokens"),
        ({"prompt": "x", "temperature": True}, "temperature"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "min_tokens": 3}, "min_tokens"),
        ({"prompt": "x", "logprobs": 1}, "logprobs"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "stop": [1]}, "stop"),
        ({"prompt": "x", "stop_token_ids": ["a"]}, "stop_token_ids"),
        ({"prompt": "x", "best_of": 0}, "best_of"),
        ({"prompt": "x", "n": 3, "best_of": 2}, "best_of"),
        ({"prompt": "x", "use_beam_search": True, "temperature": 0.5}, "temperature"),
        ({"prompt": "x", "use_beam_search": True, "early_stopping": "soon"}, "early_stopping"),
        ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_bad_field_is_named(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        completion_input(body, "r", "c")
    assert info.value.field == field


def test_beam_search_extra_body() -> None:
    body = {"n": 2, "best_of": 4, "use_beam_search": True, "length_penalty": 0.5, "early_stopping": "never"}
    params = sampling_params(body, None)
    assert (params.beam_width, params.n, params.temperature) == (4, 2, 0.0)
    assert (params.length_penalty, params.early_stopping) == (0.5, "never")


def test_top_k_zero_is_off_and_max_completion_tokens() -> None:
    params = sampling_params({"top_k": 0, "max_completion_tokens": 9}, None)
    assert (params.top_k, params.max_tokens) == (-1, 9)


def test_chat_input_content_parts_and_default_max_tokens() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    body = {"messages": [{"role": "system", "content": None}, {"role": "user", "content": parts}]}
    call = chat_input(body, "r", "c", None, 100)
    assert call.messages == (ChatMessage("system", ""), ChatMessage("user", "ab"))
    assert call.params.max_tokens == 16
    tokenized = chat_input(body, "r", "c", [1, 2, 3], 100)
    assert (tokenized.token_ids, tokenized.messages, tokenized.params.max_tokens) == ((1, 2, 3), None, 97)
    with pytest.raises(InvalidArgumentError) as info:
        chat_input({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "r", "c", None, 100)
    assert info.value.field == "messages[0].content[0]"  # an image_url part without its url


def _chunk(index: int, text: str, finish: str | None = None, usage: Usage | None = None) -> CompletionChunk:
    return CompletionChunk(index, text, (1,), finish_reason=finish, usage=usage)  # type: ignore[arg-type]


def test_bodies_non_streaming_and_streaming() -> None:
    usage = Usage(prompt_tokens=5, completion_tokens=3, cached_prompt_tokens=0)
    completions = CompletionBodies("completions", "r1", "smol", created=100)
    last = _chunk(0, "c", "length", usage)
    assert completions.response({0: "abc"}, {0: last}, usage) == {
        "id": "cmpl-r1",
        "object": "text_completion",
        "created": 100,
        "model": "smol",
        "choices": [{"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None, "text": "abc"}],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }
    chat = CompletionBodies("chat", "r2", "smol", created=100)
    assert chat.chunk(_chunk(0, "Hi"), first=True, include_usage=True) == {
        "id": "chatcmpl-r2",
        "object": "chat.completion.chunk",
        "created": 100,
        "model": "smol",
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
                "delta": {"role": "assistant", "content": "Hi"},
            }
        ],
        "usage": None,
    }
    assert chat.chunk(_chunk(0, "!", "stop"), first=False, include_usage=False)["choices"][0]["delta"] == {
        "content": "!"
    }
    assert chat.usage_chunk(usage)["choices"] == []
    assert chat.response({0: "Hi!"}, {0: _chunk(0, "!", "stop")}, usage)["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hi!",
    }


def test_errors_map_to_openai_shapes() -> None:
    bad = http_error(InvalidArgumentError("sampling_params.max_tokens", "too many"))
    assert (bad.status, bad.body(), bad.headers()) == (
        400,
        {
            "error": {
                "message": "max_tokens: too many",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "INVALID_ARGUMENT",
            }
        },
        {},
    )
    assert http_error(InvalidArgumentError("text", "empty")).param == "prompt"
    busy = http_error(ResourceExhaustedError("queue full", retry_after_s=1.2))
    assert (busy.status, busy.headers(), busy.body()["error"]) == (
        429,
        {"Retry-After": "2"},
        {"message": "queue full", "type": "rate_limit_error", "param": None, "code": "RESOURCE_EXHAUSTED"},
    )
    assert http_error(ResourceExhaustedError("x")).headers() == {"Retry-After": "1"}
    assert (http_error(UnavailableError("no pod")).status, http_error(UnavailableError("no pod")).headers()) == (
        503,
        {},
    )
    assert http_error(UnauthenticatedError("no token")).status == 401
    assert http_error(PermissionDeniedError("bad token")).status == 403
    assert http_error(RuntimeError("boom")).body()["error"]["message"] == "internal error"


@pytest.mark.anyio
async def test_running_requests_abort_is_idempotent() -> None:
    running = RunningRequests(max_finished=1)
    started = asyncio.Event()

    async def serve() -> None:
        with running.running("r1"):
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(serve())
    await started.wait()
    assert (running.abort("r1"), len(running)) == ((AbortResult.ABORTED, 1), 1)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (running.abort("r1"), running.abort("r2"), len(running)) == (
        (AbortResult.ALREADY_FINISHED, 0),
        (AbortResult.NOT_FOUND, 0),
        0,
    )
