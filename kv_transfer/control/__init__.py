"""The control plane that the socket backends (tcp, cuda_ipc, nccl) share.

Every socket backend talks over one TCP connection per sender and receiver pair: HELLO (backend, layout and the
backend's data-plane fields), then CHUNK / ACK / ERROR / ABORT frames (`frames`). `SocketSender` and
`SocketReceiver` run that protocol and the transfer rules; each backend's subclass makes its data plane
(`data_plane`), which moves the bytes.
"""
