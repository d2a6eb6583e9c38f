"""Speculative decoding: proposers (n-gram prompt lookup, replay, a draft model), config, and the verification
rules."""
