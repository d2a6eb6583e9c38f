"""Send an image through a pdserve HTTP API with the official `openai` Python SDK and print what came back, as one
JSON object: a greedy chat completion whose user message holds text and the image (a base64 data URL), streamed and
not. Run it with the Python of a virtualenv holding `openai`, e.g.:
    /tmp/openai-venv/bin/python scripts/openai_image_check.py --base-url http://127.0.0.1:8000/v1 --image cat.png
tests/e2e/test_image_inputs.py compares its output with the gRPC API's. This file imports nothing of pdserve's.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

from openai import OpenAI


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", required=True)
    parser.add_argument("--image", type=Path, required=True, help="a PNG or JPEG file")
    parser.add_argument("--text", default="What is in this image?")
    parser.add_argument("--max-tokens", type=int, default=12)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    kind = "png" if args.image.read_bytes()[:4] == b"\x89PNG" else "jpeg"
    url = f"data:image/{kind};base64,{base64.b64encode(args.image.read_bytes()).decode()}"
    content = [{"type": "text", "text": args.text}, {"type": "image_url", "image_url": {"url": url}}]
    messages = [{"role": "user", "content": content}]
    greedy = {"model": args.model, "max_tokens": args.max_tokens, "temperature": 0}
    chat = client.chat.completions.create(messages=messages, **greedy)  # type: ignore[arg-type]
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **greedy))  # type: ignore[arg-type]
    got = {
        "text": chat.choices[0].message.content,
        "prompt_tokens": chat.usage.prompt_tokens if chat.usage else None,
        "stream_text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
    }
    json.dump(got, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
