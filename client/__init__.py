"""The Python client of pdserve's public API (`pdserve.v1.GenerationService`): `generate` for one streamed request,
`GenerationClient` for a channel kept open, `build_request` for the request message alone."""

from client.generation_client import GenerationClient, build_request, generate

__all__ = ["GenerationClient", "build_request", "generate"]
