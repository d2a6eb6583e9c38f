"""Kernel micro-benchmarks on the GPU (attention, GEMV in bf16, fp8 and int4, the fused layers) and the CUDA-graph
timing they share."""
