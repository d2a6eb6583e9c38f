"""Kernel micro-benchmarks on the GPU (attention, GEMV in bf16, fp8 and int4, the fused layers); their CUDA-graph
timing and inputs are the tuners' (engine.tuning)."""
