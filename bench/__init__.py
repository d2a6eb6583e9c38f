"""`pdserve bench`: the workloads of docs/workloads.md, by kind: `offline` (the engine in this process), `online`
(through the router of a real cluster), `kv_transfer` (W6), `kernels` (GPU micro-benchmarks) and `reporting`
(statistics, device limits, the GPU scripts' summaries); `workloads` holds the request sets they share."""
