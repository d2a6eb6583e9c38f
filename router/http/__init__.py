"""The router's OpenAI-compatible HTTP API, served beside the gRPC API from the same `RequestLifecycle`.

- `protocol`: JSON request bodies -> `GenerateInput`, and `CompletionChunk`s -> OpenAI response and chunk bodies;
- `errors`: pdserve errors -> OpenAI-shaped error responses (400 naming the field, 429 + Retry-After, 503, ...);
- `streaming`: server-sent events, with the client's disconnect cancelling the request;
- `app`: the Starlette routes (completions, chat, models, health, metrics, tokenize, detokenize) and bearer auth;
- `http_server`: uvicorn inside the router process, on the gRPC server's event loop.
"""
