"""Beam search: one request, `beam_width` sequences sharing their KV blocks copy-on-write (see beam_search.py)."""
