"""Fixtures of the security tests: one folder of throwaway credentials for the whole session (the cluster CA and
its certificates, a token, a Redis password), plus a rogue CA and a certificate it signed, which carries the
cluster's internal name but not its CA's signature."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.credentials import ClusterCredentials, make_ca, make_leaf
from common.tls import INTERNAL_SERVER_NAME, ClusterTLSConfig


@pytest.fixture(scope="session")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> ClusterCredentials:
    folder = tmp_path_factory.mktemp("credentials")
    made = ClusterCredentials.create(folder)
    make_ca(folder, "rogue-ca")
    make_leaf(folder, "rogue", [f"DNS:{INTERNAL_SERVER_NAME}", "IP:127.0.0.1"], ca="rogue-ca")
    return made


@pytest.fixture(scope="session")
def cluster_tls(credentials: ClusterCredentials) -> ClusterTLSConfig:
    """The internal planes' mTLS config of a cluster process."""
    return ClusterTLSConfig(str(credentials.ca), str(credentials.cert("internal")), str(credentials.key("internal")))


@pytest.fixture(scope="session")
def rogue_tls(credentials: ClusterCredentials) -> ClusterTLSConfig:
    """A peer with a certificate of its own CA: the right name, the wrong signature (it trusts the cluster CA)."""
    folder: Path = credentials.folder
    return ClusterTLSConfig(str(credentials.ca), str(folder / "rogue.pem"), str(folder / "rogue.key"))
