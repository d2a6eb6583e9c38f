"""The cuda_ipc backend: prefill and decode pods on one host, on one GPU or two; decode reads the prefill pool.

The control plane is the socket backends' (`kv_transfer.tcp`); only the bytes take another way. Lifecycle:
1. prefill, once: the sender exports its pool (`PoolHandle`: a CUDA IPC handle of the allocation that holds the pool,
   and where in it the pool starts) and registers the pool in its own process (`local_pools`). A parallel engine's
   pools were mapped from its workers, which cannot be exported again: each worker exports its own pool, and the
   rank's sender passes that handle on (`KVPoolView.ipc_handle`).
2. first contact: the sender's HELLO carries the handle; the receiver maps the prefill pool ONCE per sender pool
   (shared by every connection from it) on its own device: a pool on another GPU is then read over NVLink (peer
   access). A sender in the receiver's own process is known by its process id: CUDA cannot open a handle in the
   process that exported it, so the receiver takes the registered tensor itself.
3. per chunk: `send` records a CUDA event on the caller's current stream (after the engine step that wrote the
   blocks) and returns; the connection's writer waits for that event, then sends a CHUNK frame naming source and
   destination block ids, with no payload. The receiver checks the ids (source ids against the mapped pool), copies
   each source row straight into its reserved block in one kernel on its own stream (`kv_transfer.block_copy`: every
   byte read once, over NVLink when the pool is on the other GPU, and written once), waits for it, and acks: no host
   copy, no temporary, whole blocks as 8-byte words. (A host pool, or a colocated sender's pool on another device of
   the receiver's own process, is gathered then scattered by torch.)
4. ends: as for every backend (`kv_transfer.base`): the source blocks stay pinned until `on_finished`; a chunk of an
   aborted, expired or unknown transfer is refused before anything is copied. The mapping lives while a connection
   from that sender does (the prefill pool, the engine's KV cache, outlives them).
Pools must be CUDA tensors (`make_sender`/`make_receiver` refuse others); a host pool works only within one process.
"""

from kv_transfer.cuda_ipc.receiver import CudaIpcReceiver
from kv_transfer.cuda_ipc.sender import CudaIpcSender

__all__ = ["CudaIpcReceiver", "CudaIpcSender"]
