"""Fixtures of the fault suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.cluster import LocalCluster
from tests.faults.input_support import KV_LEASE_S, fault_cluster


@pytest.fixture(scope="session")
def input_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """2 prefill + 1 decode pods and the router, shared by the hostile-input, Redis and router-restart tests (run in
    that order: the restarts come last); `--kv-lease-s` KV_LEASE_S, so fuzzed reservations lapse soon."""
    log_dir = tmp_path_factory.mktemp("input-cluster-logs")
    with fault_cluster(log_dir, num_prefill=2, pod_args=("--kv-lease-s", str(KV_LEASE_S))) as cluster:
        yield cluster
