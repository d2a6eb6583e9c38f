"""Public gRPC front door: tokenization, routing to prefill and decode pods, streaming detokenized text."""
