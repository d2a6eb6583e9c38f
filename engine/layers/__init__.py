"""Building blocks of the native models."""
