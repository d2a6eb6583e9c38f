"""Image inputs: LLaVA's image encoder, its preprocessing, and the hooks that splice its embeddings into a prompt."""
