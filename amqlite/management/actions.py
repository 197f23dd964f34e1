"""The HTTP side of operator actions: errors with a status, and the status of each kind
of ``OperationError``.

What an action does lives in the broker's operator API (``amqlite.broker.operations``);
the management API parses the request, checks who asks, calls it and answers.
"""

from __future__ import annotations

from amqlite.broker.operations import ErrorKind, OperationError

#: The HTTP status answering each kind of failed operation.
HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.BAD_REQUEST: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.UNAVAILABLE: 503,
}


class ActionError(Exception):
    """A request that cannot be answered; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @classmethod
    def of(cls, error: OperationError) -> ActionError:
        """The answer to a failed operation."""
        return cls(HTTP_STATUS[error.kind], str(error))
