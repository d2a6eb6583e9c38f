"""`pdserve generate`: stream one completion from a running router, then a one-line summary on stderr."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, cast

import grpc

from client.generation_client import generate
from common.grpc.errors import bad_request_fields
from common.tls import client_security
from pdserve.v1 import generation_pb2, sampling_pb2

if TYPE_CHECKING:
    from cli.up_command import Commands

TOKEN_VARIABLE = "PDSERVE_TOKEN"
_EXIT_INTERRUPTED = 130


def add_generate_parser(commands: Commands) -> None:
    gen = commands.add_parser("generate", help="stream one completion from a running router")
    gen.add_argument("prompt", help="the prompt text (with --chat: one user message)")
    gen.add_argument("--address", default="localhost:50051", help="the router (default: localhost:50051)")
    gen.add_argument("--chat", action="store_true", help="send the prompt as a chat message (chat template)")
    gen.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate (default: 64)")
    gen.add_argument("--temperature", type=float, help="0 is greedy (default: the server's, 1.0)")
    gen.add_argument("--top-p", type=float, help="nucleus sampling threshold in (0, 1]")
    gen.add_argument("--top-k", type=int, help="keep only the k most likely tokens")
    gen.add_argument("--seed", type=int, help="seed for reproducible sampling")
    gen.add_argument("--stop", action="append", help="a stop string (repeatable)")
    gen.add_argument("--timeout-s", type=float, help="deadline of the whole request")
    gen.add_argument(
        "--token",
        default=os.environ.get(TOKEN_VARIABLE),
        help=f"bearer token of a router with auth on (default: env {TOKEN_VARIABLE})",
    )
    gen.add_argument("--tls-ca", help="dial the router over TLS, verifying it against this PEM CA")
    gen.set_defaults(func=_generate)


def _generate(args: argparse.Namespace, extra: list[str]) -> int:
    sampling = {
        name: value
        for name, value in (
            ("max_tokens", args.max_tokens),
            ("temperature", args.temperature),
            ("top_p", args.top_p),
            ("top_k", args.top_k),
            ("seed", args.seed),
            ("stop", args.stop),
        )
        if value is not None
    }
    prompt = {"messages": [{"role": "user", "content": args.prompt}]} if args.chat else {"prompt": args.prompt}
    last: generation_pb2.GenerateResponse | None = None
    try:
        security = client_security(args.tls_ca)
        for response in generate(
            args.address, timeout_s=args.timeout_s, token=args.token, security=security, **prompt, **sampling
        ):
            sys.stdout.write(response.text)
            sys.stdout.flush()
            last = response
    except grpc.RpcError as exc:
        if last is not None:
            print(flush=True)
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        # NOTE: a sync call's error carries the same trailing metadata, all bad_request_fields reads.
        for field_path, description in bad_request_fields(cast(grpc.aio.AioRpcError, exc)):
            print(f"  {field_path}: {description}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _EXIT_INTERRUPTED
    print(flush=True)
    if last is not None:
        print(_summary(last), file=sys.stderr)
    return 0


def _summary(last: generation_pb2.GenerateResponse) -> str:
    """One line: finish reason, usage, and where and how fast the router served the request."""
    finish = sampling_pb2.FinishReason.Name(last.finish_reason).removeprefix("FINISH_REASON_").lower()
    usage, metrics = last.usage, last.metrics
    line = (
        f"[finish_reason={finish} prompt_tokens={usage.prompt_tokens} completion_tokens={usage.completion_tokens} "
        f"cached_prompt_tokens={usage.cached_prompt_tokens}"
    )
    if last.HasField("metrics"):
        line += (
            f" prefill_pod={metrics.prefill_pod_id} decode_pod={metrics.decode_pod_id or '-'} "
            f"kv_transfer_bytes={metrics.kv_transfer_bytes} "
            f"ttft_ms={metrics.time_to_first_token.ToMilliseconds()}"
        )
    return line + "]"
