"""Fixtures of the end-to-end tests: one real cluster for the whole session (Redis, 2 prefill pods, 2 decode
pods, the router: real processes over real sockets; tracing off, no /metrics endpoints), a client of its
router (the oracle of greedy outputs is the session's, tests/conftest.py). A failing test's report carries the tail
of every cluster process's log.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from tests.e2e.support import cluster_config

_clusters: list[LocalCluster] = []


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """2 prefill + 2 decode pods and the router; tests may add and stop pods and restart Redis."""
    config = cluster_config(tmp_path_factory.mktemp("cluster-logs"), num_prefill=2, num_decode=2)
    with LocalCluster(config) as cluster:
        _clusters.append(cluster)
        yield cluster
    _clusters.remove(cluster)


@pytest.fixture
def cluster(shared_cluster: LocalCluster) -> LocalCluster:
    """The shared cluster, checked alive before each test (a dead process fails the test with its log)."""
    exited = shared_cluster.poll_exited()
    if exited is not None:
        pytest.fail(f"{exited.name} exited with code {exited.returncode}; log tail:\n{exited.log_tail()}")
    return shared_cluster


@pytest.fixture(scope="session")
def client(shared_cluster: LocalCluster) -> Iterator[GenerationClient]:
    with GenerationClient(shared_cluster.router_address) as generation_client:
        yield generation_client


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    report = yield
    if isinstance(report, pytest.TestReport) and report.failed:
        for cluster in _clusters:
            report.sections.append((f"pdserve logs ({cluster.log_dir})", cluster.log_tails()))
    return report
