"""What the kernel tuners (each beside the table it writes) and bench's kernel micro-benchmarks share: CUDA-graph
timing, a sweep's rows, the device's measured limits, random inputs at the Qwen3-8B shapes. GPU only, and imported
only by those: nothing the engine runs to serve imports it."""
