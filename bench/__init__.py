"""`pdserve bench`: the workloads of BENCHMARKS.md run against the engine in-process."""
