"""The tcp backend: KV blocks over plain TCP sockets (CPU pools, or across hosts without NCCL)."""

from kv_transfer.tcp.receiver import TcpReceiver
from kv_transfer.tcp.sender import TcpSender

__all__ = ["TcpReceiver", "TcpSender"]
