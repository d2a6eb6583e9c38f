"""The one way pdserve opens a Redis client from a `--redis-url`, and the one way it prints that URL.

URLs: `redis://[:password@]host:port/db`, `rediss://...` for TLS, `unix://path`. A `rediss://` URL may name its PEM
files as query parameters, which redis-py's own URL parser does not take: `ssl_ca_certs` (the CA that signed the
server's certificate), `ssl_certfile` and `ssl_keyfile` (a client certificate, when Redis asks for one), e.g.
`rediss://:secret@redis:6380/0?ssl_ca_certs=/etc/pdserve/tls/ca.pem`. Never log a URL as given: `redact` hides
its password.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

SSL_FILE_PARAMETERS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
MAX_CONNECTIONS = 16
"""Connections one client holds at most; a call beyond them waits (within its timeout) for one to come free."""


def open_redis(redis_url: str, timeout_s: float) -> aioredis.Redis:
    """A client of `redis_url` whose calls time out after `timeout_s`.

    NOTE: no backoff and one immediate retry on a dropped connection (a restarted Redis), none on timeouts: a call
    costs at most ~2 x timeout_s, and the pool reconnects by itself. A wrong or missing password is a connection
    error too: callers report it as Redis being unavailable. The pool is bounded (MAX_CONNECTIONS): a burst of
    calls (the router's directory lookups when hundreds of requests arrive at once) reuses a few connections
    instead of opening one per call, each a handshake of several commands on the event loop.
    """
    url, ssl_files = _split_ssl_files(redis_url)
    retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=retry,
        **ssl_files,
    )
    return aioredis.Redis.from_pool(pool)


def redact(redis_url: str) -> str:
    """`redis_url` with its password (if any) replaced by `***`."""
    parts = urlsplit(redis_url)
    if parts.password is None:
        return redis_url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _split_ssl_files(redis_url: str) -> tuple[str, dict[str, Any]]:
    """(the URL without the SSL file parameters, those parameters)."""
    parts = urlsplit(redis_url)
    query = parse_qsl(parts.query)
    ssl_files = {name: value for name, value in query if name in SSL_FILE_PARAMETERS}
    rest = [(name, value) for name, value in query if name not in SSL_FILE_PARAMETERS]
    return urlunsplit(parts._replace(query=urlencode(rest))), ssl_files
