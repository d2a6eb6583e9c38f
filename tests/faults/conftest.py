"""Fixtures of the fault suite: the hostile-input tests' shared cluster; a client of a module's own `cluster`, for the
kill and SIGSTOP tests (their oracle is the session's, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from tests.faults.input_support import KV_LEASE_S
from tests.faults.support import fault_cluster


@pytest.fixture(scope="session")
def input_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """2 prefill + 1 decode pods and the router, shared by the hostile-input, Redis and router-restart tests (run in
    that order: the restarts come last); `--kv-lease-s` KV_LEASE_S, so fuzzed reservations lapse soon."""
    log_dir = tmp_path_factory.mktemp("input-cluster-logs")
    with fault_cluster(log_dir, num_prefill=2, pod_args=("--kv-lease-s", str(KV_LEASE_S))) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[GenerationClient]:
    """A client of the router of the module's `cluster` fixture."""
    with GenerationClient(cluster.router_address) as generation_client:
        yield generation_client
