"""`pdserve credentials DIR` (the files `pdserve up --secure`, compose and Kubernetes use): private modes, the names
the certificates carry, and chains that verify against the cluster CA only."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

from cli.main import main
from common.tls import INTERNAL_SERVER_NAME


def _openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


def test_the_bundle_is_private_and_names_the_cluster(tmp_path: Path) -> None:
    folder = tmp_path / "secure"
    assert main(["credentials", str(folder), "--public-name", "pdserve.example.com"]) == 0
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for secret in ("ca.key", "public.key", "internal.key", "tokens", "redis-password"):
        assert stat.S_IMODE((folder / secret).stat().st_mode) == 0o600, secret
    assert len((folder / "tokens").read_text().strip()) >= 32
    internal = _openssl("x509", "-in", str(folder / "internal.pem"), "-noout", "-ext", "subjectAltName")
    assert f"DNS:{INTERNAL_SERVER_NAME}, DNS:localhost, IP Address:127.0.0.1" in internal
    public = _openssl("x509", "-in", str(folder / "public.pem"), "-noout", "-ext", "subjectAltName")
    assert "DNS:pdserve.example.com" in public and "IP Address:127.0.0.1" in public
    for name in ("internal", "public"):
        assert _openssl("verify", "-CAfile", str(folder / "ca.pem"), str(folder / f"{name}.pem")).strip() == (
            f"{folder / name}.pem: OK"
        )
