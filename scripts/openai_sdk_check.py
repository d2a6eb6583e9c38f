"""Drive a pdserve HTTP API with the official `openai` Python SDK and print what it got, as one JSON object.

Run it with the Python of a virtualenv holding `openai` (not pdserve's own), e.g.:
    python3 -m venv /tmp/openai-venv && /tmp/openai-venv/bin/pip install openai
    /tmp/openai-venv/bin/python scripts/openai_sdk_check.py --base-url http://127.0.0.1:8000/v1
It runs greedy completions and chat completions, streaming and not, and prints for each its text, finish reason
and usage (the caller compares them with the gRPC API's; tests/e2e/test_http_api.py does).
This file imports nothing of pdserve's.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from openai import OpenAI


def _usage(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def run(client: OpenAI, model: str, prompt: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    greedy: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    completion = client.completions.create(prompt=prompt, **greedy)
    chat = client.chat.completions.create(messages=messages, **greedy)  # type: ignore[arg-type]
    completion_chunks = list(
        client.completions.create(prompt=prompt, stream=True, stream_options={"include_usage": True}, **greedy)
    )
    chat_chunks = list(
        client.chat.completions.create(
            messages=messages,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
            **greedy,
        )
    )
    return {
        "models": [m.id for m in client.models.list().data],
        "completion": {
            "text": completion.choices[0].text,
            "finish_reason": completion.choices[0].finish_reason,
            "usage": _usage(completion.usage),
        },
        "chat": {
            "text": chat.choices[0].message.content,
            "finish_reason": chat.choices[0].finish_reason,
            "usage": _usage(chat.usage),
        },
        "completion_stream": {
            "text": "".join(c.choices[0].text for c in completion_chunks if c.choices),
            "num_chunks": sum(1 for c in completion_chunks if c.choices),
            "usage": _usage(completion_chunks[-1].usage),
        },
        "chat_stream": {
            "text": "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices),
            "num_chunks": sum(1 for c in chat_chunks if c.choices),
            "usage": _usage(chat_chunks[-1].usage),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none", help="the bearer token, when the router checks tokens")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt", default="The three primary colors are")
    parser.add_argument("--chat", default="Name a fruit.", help="the one user message of the chat requests")
    parser.add_argument("--max-tokens", type=int, default=12)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    result = run(client, args.model, args.prompt, [{"role": "user", "content": args.chat}], args.max_tokens)
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
