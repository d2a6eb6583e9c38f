"""Transfer states and the errors a transfer can end with (each error names the state it ends in)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import ClassVar

from common.errors import PdserveError


class TransferState(enum.Enum):
    """Where one transfer stands. RESERVED -> TRANSFERRING -> DONE, or an end without data."""

    RESERVED = "reserved"
    TRANSFERRING = "transferring"
    DONE = "done"
    FAILED = "failed"
    EXPIRED = "expired"
    ABORTED = "aborted"

    @property
    def is_final(self) -> bool:
        """True once no more chunks will be accepted (DONE included: it only waits for a claim)."""
        return self not in (TransferState.RESERVED, TransferState.TRANSFERRING)


class TransferError(PdserveError):
    """A transfer could not go on. `code` names the error on the wire; `ends_in` is the state it causes."""

    status = "ABORTED"
    code: ClassVar[str] = "failed"
    ends_in: ClassVar[TransferState] = TransferState.FAILED

    def for_request(self, request_id: str) -> TransferError:
        """The same error, its message naming the request it ended (as reported to that request's caller)."""
        return type(self)(f"request {request_id!r}: {self}")


class LayoutMismatchError(TransferError):
    """The two pools' KV layouts differ; `fields` names the differing layout fields."""

    status = "FAILED_PRECONDITION"
    code = "layout_mismatch"

    def __init__(self, message: str, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


class TransferExpiredError(TransferError):
    """The transfer's lease lapsed: its blocks were (or are being) released."""

    code = "expired"
    ends_in = TransferState.EXPIRED


class TransferAbortedError(TransferError):
    """The transfer was aborted by one side."""

    code = "aborted"
    ends_in = TransferState.ABORTED


class UnknownTransferError(TransferError):
    """No record of this transfer id (never reserved, already claimed, or long gone)."""

    status = "NOT_FOUND"
    code = "unknown_transfer"


class TransferStateError(TransferError):
    """The operation does not fit the transfer's state (claim before DONE, a chunk after the last one, ...)."""

    code = "bad_state"


class InvalidChunkError(TransferError):
    """A chunk names blocks outside its reservation, or the last chunk leaves reserved blocks unwritten."""

    code = "invalid_chunk"


class TransportError(TransferError):
    """The peer is unreachable, or the connection broke or timed out."""

    code = "transport"


class ProtocolError(TransportError):
    """A frame that does not follow the wire protocol; the connection is closed."""

    code = "protocol"


_ERRORS_BY_CODE: dict[str, type[TransferError]] = {
    cls.code: cls
    for cls in (
        TransferError,
        LayoutMismatchError,
        TransferExpiredError,
        TransferAbortedError,
        UnknownTransferError,
        TransferStateError,
        InvalidChunkError,
        TransportError,
        ProtocolError,
    )
}


def error_from_code(code: str, message: str) -> TransferError:
    """Rebuild an error sent by the peer (unknown codes become a plain TransferError)."""
    return _ERRORS_BY_CODE.get(code, TransferError)(message)
