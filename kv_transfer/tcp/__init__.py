"""The tcp backend: KV blocks over plain TCP, on the control plane's own socket (CPU pools, or across hosts
without NCCL). The control plane it shares with cuda_ipc and nccl lives in `kv_transfer.control`."""

from kv_transfer.tcp.receiver import TcpReceiver
from kv_transfer.tcp.sender import TcpSender

__all__ = ["TcpReceiver", "TcpSender"]
