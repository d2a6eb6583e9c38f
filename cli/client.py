"""Deprecated alias of the package `client` (`from client import generate`), kept for one release."""

import warnings

from client.generation_client import GenerationClient, build_request, generate

warnings.warn("cli.client is deprecated: import from the package `client` instead", DeprecationWarning, stacklevel=2)

__all__ = ["GenerationClient", "build_request", "generate"]
