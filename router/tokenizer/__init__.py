"""Tokenization off the event loop: the pool of tokenizer worker processes (`tokenizer_pool`) and the router's end
of each one (`tokenizer_worker`)."""
