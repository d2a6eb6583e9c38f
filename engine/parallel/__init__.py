"""Tensor and pipeline parallelism inside one engine: the worker processes, their collectives, the sharded layers
and the per-rank weight loading.

With tensor_parallel_size x pipeline_parallel_size > 1 the engine (scheduler, block manager, servicer) stays in
its process and drives one worker process per device (`executor.ParallelExecutor`); each worker runs a
`ModelRunner` over its shard of the model and its slice of the KV pool (`communicator.ParallelRank`).
"""
