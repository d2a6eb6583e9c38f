"""Security figures (docs/reliability.md, "## Security"): what TLS and mTLS cost, and what a secure cluster refuses.

1. KV transfer over the tcp backend, plain and mutual TLS: `--kv-blocks` blocks of SmolLM2-135M's size (720 KiB)
   in chunks of 16, loopback, one connection; MB/s over `--kv-rounds` rounds (best of).
2. A plain and a secure local cluster (1 prefill + 1 decode, `ClusterConfig.credentials`), one after the other:
   `--requests` sequential greedy requests of 64 tokens each; median end-to-end and time to first token.
3. On the secure cluster: a call without a token, with a wrong one, a plain-text call, a pod health check without a
   client certificate, a KV sender with a certificate of another CA, a Redis client without the password: each
   one's outcome.
Not a test: it prints what happened.

Usage: .venv/bin/python scripts/security_probe.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import grpc
import torch

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig
from cli.credentials import ClusterCredentials, make_ca, make_leaf
from cli.health import check_health
from client.generation_client import GenerationClient
from common.errors import UnavailableError
from common.pod_registry import PodRegistry
from common.tls import INTERNAL_SERVER_NAME, ClusterTLSConfig, client_security, kv_client_context, kv_server_context
from kv_transfer import KVLayout, TransferState
from kv_transfer.tcp import TcpReceiver, TcpSender

PROMPT = "Once upon a time a robot learned to paint the sea, and every evening it painted one more wave. "
POD_ARGS = ("--heartbeat-s", "0.2", "--num-blocks", "512")
SMOLLM2_BLOCK = (30, 2, 16, 3, 64)  # layers, K/V, block size, kv heads, head dim: 720 KiB in bfloat16


def kv_throughput(tls: ClusterTLSConfig | None, num_blocks: int, rounds: int) -> float:
    """Best MB/s of `rounds` transfers of `num_blocks` blocks in chunks of 16."""
    source = torch.randn((num_blocks, *SMOLLM2_BLOCK)).to(torch.bfloat16)
    destination = torch.zeros_like(source)
    server = kv_server_context(tls) if tls else None
    client = kv_client_context(tls) if tls else None
    best = 0.0
    with TcpReceiver(destination, 16, ssl_context=server) as receiver, TcpSender(source, 16, ssl_context=client) as s:
        for i in range(rounds):
            ids = list(range(num_blocks))
            receiver.expect(f"t{i}", ids, lease_s=30.0)
            started = time.perf_counter()
            for start in range(0, num_blocks, 16):
                chunk = ids[start : start + 16]
                s.send(f"t{i}", receiver.endpoint, receiver.layout, chunk, chunk, last=start + 16 >= num_blocks)
            assert s.wait(f"t{i}", 60.0) is TransferState.DONE
            best = max(best, source.nbytes / (time.perf_counter() - started) / 1e6)
            receiver.wait(f"t{i}", 10.0)
            receiver.claim(f"t{i}")
    assert torch.equal(source, destination)
    return best


def request_times(cluster: LocalCluster, client: GenerationClient, num_requests: int) -> tuple[float, float]:
    """(median end-to-end s, median time to first token s) of sequential greedy requests."""
    e2e, ttft = [], []
    for _ in range(num_requests):
        started = time.perf_counter()
        first = None
        for _response in client.generate(PROMPT, max_tokens=64, temperature=0.0, ignore_eos=True):
            first = first or time.perf_counter()
        e2e.append(time.perf_counter() - started)
        ttft.append((first or started) - started)
    return statistics.median(e2e), statistics.median(ttft)


def refusals(cluster: LocalCluster, credentials: ClusterCredentials, rogue: ClusterTLSConfig) -> dict[str, str]:
    """What the secure cluster answers to each peer without the right credentials."""
    outcomes: dict[str, str] = {}
    security = client_security(str(credentials.ca))
    for name, token, sec in (
        ("no token", None, security),
        ("wrong token", "nope", security),
        ("plain text", credentials.token, None),
    ):
        try:
            with GenerationClient(cluster.router_address, token, sec) as client:
                list(client.generate(PROMPT, max_tokens=2, timeout_s=10.0))
            outcomes[name] = "served"
        except grpc.RpcError as exc:
            outcomes[name] = exc.code().name
    [prefill] = [p for p in cluster.pod_infos() if p.role == "prefill"]
    [decode] = [p for p in cluster.pod_infos() if p.role == "decode"]
    no_cert = client_security(str(credentials.ca), server_name=INTERNAL_SERVER_NAME)
    outcomes["pod health, no client cert"] = asyncio.run(check_health(prefill.address, security=no_cert)).status
    pool = torch.zeros((1, *SMOLLM2_BLOCK))
    with TcpSender(pool, 16, ssl_context=kv_client_context(rogue)) as sender:
        sender.send("rogue", decode.kv_endpoint, KVLayout.from_pool(pool, 16), [0], [0], last=True)
        outcomes["KV sender, other CA"] = sender.wait("rogue", 10.0).name
    url = urlsplit(cluster.redis_url)
    try:
        asyncio.run(PodRegistry(urlunsplit(url._replace(netloc=f"{url.hostname}:{url.port}"))).list_pods())
        outcomes["Redis, no password"] = "served"
    except UnavailableError as exc:
        outcomes["Redis, no password"] = str(exc)[:60]
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-blocks", type=int, default=256)
    parser.add_argument("--kv-rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pdserve-security-"))
    credentials = ClusterCredentials.create(folder / "secure")
    make_ca(folder / "secure", "rogue-ca")
    make_leaf(folder / "secure", "rogue", [f"DNS:{INTERNAL_SERVER_NAME}"], ca="rogue-ca")
    rogue = ClusterTLSConfig(str(credentials.ca), str(folder / "secure/rogue.pem"), str(folder / "secure/rogue.key"))
    for name, tls in (("plain", None), ("mTLS", credentials.cluster_tls())):
        print(f"KV tcp {name}: {kv_throughput(tls, args.kv_blocks, args.kv_rounds):.0f} MB/s", flush=True)
    for name, secure in (("plain", None), ("secure", credentials)):
        config = ClusterConfig(
            port=0,
            pod_args=POD_ARGS,
            metrics_port=None,
            log_dir=folder / name,
            registry_refresh_s=0.2,
            credentials=secure,
        )
        with LocalCluster(config) as cluster:
            token = secure.token if secure else None
            security = client_security(str(secure.ca)) if secure else None
            with GenerationClient(cluster.router_address, token, security) as client:
                request_times(cluster, client, 2)  # warm-up
                e2e, ttft = request_times(cluster, client, args.requests)
            print(f"{name} cluster: median e2e {e2e * 1e3:.0f} ms, TTFT {ttft * 1e3:.0f} ms", flush=True)
            if secure:
                for peer, outcome in refusals(cluster, secure, rogue).items():
                    print(f"  {peer}: {outcome}", flush=True)


if __name__ == "__main__":
    main()
