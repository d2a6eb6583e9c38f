"""How figures are reported: latency and throughput statistics (`stats`), ratios to the device's measured limits
(`limits`) and the GPU scripts' summary lines (`gpu_summary`)."""
