"""The nccl backend: KV blocks over NCCL point-to-point, between GPUs of one host or of different hosts.

The control plane is the socket backends' (`kv_transfer.tcp`); the bytes go over one NCCL communicator per
sender-receiver pair, rank 0 the sender and rank 1 the receiver (`PairGroup`). Lifecycle:
1. first contact: the sender's HELLO names its GPU. The receiver refuses a sender on its own GPU (NCCL cannot put
   two ranks on one device), else answers with the address of its rendezvous store (a TCPStore it starts at its first
   nccl contact, on its host) and a key prefix of the pair's own. The communicator itself is created lazily, by the
   pair's first data: rank 0 puts NCCL's unique id in the store, rank 1 reads it, both join.
2. per chunk: `send` records a CUDA event on the caller's current stream and returns. The connection's writer waits
   for it, sends the CHUNK frame (destination ids, no payload), gathers the chunk's blocks into one staging buffer on
   the sender's copy stream and sends it in one NCCL send. The receiver, reading the frame, receives into a staging
   buffer, waits for it (still watching the reservation and its own shutdown), scatters it into the reserved blocks
   in one op on its copy stream, waits, and acks. No host copy; NCCL's kernels run on NCCL's own stream.
3. refused chunks (expired, aborted, unknown): the receiver still receives the bytes, into staging that it drops, so
   both ranks stay matched; empty chunks (keepalives) move nothing.
4. ends: as for every backend (`kv_transfer.base`). When the connection ends, both links abort the communicator, so a
   send or receive left waiting on a dead peer ends too; a reconnection makes a new pair.
Pools must be CUDA tensors (`make_sender`/`make_receiver` refuse others); `pair_group` can be any `PairGroup`
factory, which lets the protocol run on host pools (over gloo) where no GPU is.
"""

from kv_transfer.nccl.pair_group import NcclPairGroup, PairGroup
from kv_transfer.nccl.receiver import NcclReceiver
from kv_transfer.nccl.sender import NcclSender

__all__ = ["NcclPairGroup", "NcclReceiver", "NcclSender", "PairGroup"]
