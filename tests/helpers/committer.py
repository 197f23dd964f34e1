"""A group committer with another ``submit``, for tests that change what reaches the
store. Put in the write buffer's place for the committer (``broker.writes.committer``):
a compiled GroupCommitter's methods cannot be replaced on the instance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SubmitThrough:
    """The committer with ``submit`` replaced; everything else is the committer's."""

    def __init__(self, committer: Any, submit: Callable[..., Any]) -> None:
        self._committer = committer
        self.submit = submit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._committer, name)
