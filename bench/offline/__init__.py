"""Offline workloads, the engine in this process: W1-W4 and idle (`cli`), W10 speculation (`w10`), the transformers
baseline, the engine profilers and the tensor-parallel TPOT; `spec_tasks/` holds W10's copy-heavy task sets."""
