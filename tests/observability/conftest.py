"""Fixtures of the observability tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (`pytest.mark.anyio`) run on asyncio only: the services are asyncio."""
    return "asyncio"
