"""Throwaway credentials for a secure local cluster (`pdserve up --secure`), made with the `openssl` command.

`ClusterCredentials.create(folder)` writes, in `folder` (private: mode 0700, keys 0600):
- `ca.pem`, `ca.key`: a cluster CA, valid for `VALID_DAYS`;
- `public.pem`, `public.key`: the router's public port (DNS localhost and this host's name, IP 127.0.0.1);
- `internal.pem`, `internal.key`: what the router, the pods and Redis show each other (DNS
  `common.tls.INTERNAL_SERVER_NAME` and localhost, IP 127.0.0.1; server and client use);
- `tokens`: one random bearer token; `redis-password`: Redis's `requirepass`.
`process_env()` turns them into the `PDSERVE_*` variables every process reads (`--tls-*`, `--mtls-*`,
`--auth-tokens-file`), so no secret appears on a command line. `pdserve credentials DIR` writes the same files for
docker compose (deploy/compose.secure.yml) and Kubernetes Secrets (deploy/kubernetes/overlays/secure).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cli.redis_server import RedisTLS
from common.config import env_name
from common.tls import (
    INTERNAL_SERVER_NAME,
    ChannelSecurity,
    ClusterTLSConfig,
    client_security,
    internal_channel_security,
)

VALID_DAYS = 30
_OPENSSL_HINT = "install it with `apt-get install -y openssl` (Debian/Ubuntu) or `brew install openssl`"
_KEY_ARGS = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True, slots=True)
class ClusterCredentials:
    """Paths of a secure cluster's credentials, and its secrets (see the module docstring)."""

    folder: Path
    token: str
    redis_password: str

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    def cert(self, name: str) -> Path:
        return self.folder / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.folder / f"{name}.key"

    @property
    def tokens_file(self) -> Path:
        return self.folder / "tokens"

    @classmethod
    def create(cls, folder: Path, public_names: Sequence[str] = ()) -> ClusterCredentials:
        """New CA, certificates, token and Redis password in `folder` (made if missing); `public_names`: more DNS
        names of the router's public certificate."""
        if shutil.which("openssl") is None:
            raise FileNotFoundError(f"openssl is not on PATH; {_OPENSSL_HINT}")
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        credentials = cls(folder, secrets.token_urlsafe(32), secrets.token_urlsafe(24))
        make_ca(folder)
        host = socket.gethostname()
        public = ["DNS:localhost", f"DNS:{host}", "IP:127.0.0.1", *(f"DNS:{name}" for name in public_names)]
        make_leaf(folder, "public", public)
        make_leaf(folder, "internal", [f"DNS:{INTERNAL_SERVER_NAME}", "DNS:localhost", "IP:127.0.0.1"])
        _write_secret(credentials.tokens_file, credentials.token + "\n")
        _write_secret(folder / "redis-password", credentials.redis_password + "\n")
        return credentials

    def process_env(self) -> dict[str, str]:
        """The variables that turn on bearer tokens, TLS and mTLS in the router and the pods."""
        fields = {
            "tls_cert": self.cert("public"),
            "tls_key": self.key("public"),
            "auth_tokens_file": self.tokens_file,
            "mtls_ca": self.ca,
            "mtls_cert": self.cert("internal"),
            "mtls_key": self.key("internal"),
        }
        return {env_name(name): str(path) for name, path in fields.items()}

    def cluster_tls(self) -> ClusterTLSConfig:
        """The internal planes' mTLS config, as the router and the pods have it."""
        return ClusterTLSConfig(str(self.ca), str(self.cert("internal")), str(self.key("internal")))

    def channel_security(self, role: str) -> ChannelSecurity:
        """How a client of the cluster dials a process of `role`: the router over TLS, a pod with mTLS."""
        if role == "router":
            return client_security(str(self.ca))
        return internal_channel_security(self.cluster_tls())

    def redis_tls(self) -> RedisTLS:
        """Redis serves TLS with the internal certificate."""
        return RedisTLS(self.cert("internal"), self.key("internal"), self.ca)


def add_credentials_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`pdserve credentials DIR`."""
    parser = commands.add_parser(
        "credentials",
        help="write a throwaway CA, certificates, token and Redis password",
        description="Write ca.pem, public.pem/.key (the router's port), internal.pem/.key "
        "(router, pods, Redis: mTLS), tokens and redis-password into FOLDER, for "
        "deploy/compose.secure.yml or the Kubernetes secure overlay.",
    )
    parser.add_argument("folder", type=Path, help="where to write them (made if missing)")
    parser.add_argument(
        "--public-name",
        action="append",
        default=[],
        metavar="DNS",
        help="another DNS name clients reach the router by (repeatable)",
    )
    parser.set_defaults(func=_write_credentials)


def _write_credentials(args: argparse.Namespace, extra: list[str]) -> int:
    credentials = ClusterCredentials.create(args.folder, args.public_name)
    print(f"wrote CA, certificates (valid {VALID_DAYS} days), token and Redis password to {credentials.folder}")
    return 0


def make_ca(folder: Path, name: str = "ca") -> None:
    """A self-signed CA `<name>.pem` / `<name>.key` in `folder`."""
    _openssl(
        "req",
        "-x509",
        *_KEY_ARGS,
        "-keyout",
        folder / f"{name}.key",
        "-out",
        folder / f"{name}.pem",
        "-days",
        str(VALID_DAYS),
        "-subj",
        f"/CN=pdserve {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    os.chmod(folder / f"{name}.key", 0o600)


def make_leaf(folder: Path, name: str, alt_names: list[str], ca: str = "ca") -> None:
    """`<name>.pem` / `<name>.key` in `folder`, signed by the CA `<ca>.pem`, for server and client use."""
    csr, extensions = folder / f"{name}.csr", folder / f"{name}.ext"
    extensions.write_text(
        f"subjectAltName={','.join(alt_names)}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl("req", *_KEY_ARGS, "-keyout", folder / f"{name}.key", "-out", csr, "-subj", f"/CN=pdserve {name}")
    _openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        folder / f"{ca}.pem",
        "-CAkey",
        folder / f"{ca}.key",
        "-CAcreateserial",
        "-out",
        folder / f"{name}.pem",
        "-days",
        str(VALID_DAYS),
        "-extfile",
        extensions,
    )
    os.chmod(folder / f"{name}.key", 0o600)
    csr.unlink()
    extensions.unlink()


def _write_secret(path: Path, text: str) -> None:
    path.touch(mode=0o600)
    path.write_text(text)


def _openssl(*args: str | Path) -> None:
    result = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed ({result.returncode}): {result.stderr.strip()}")
