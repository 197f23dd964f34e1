"""Shared by the selector unit tests: a message context and a one-call evaluation."""

from __future__ import annotations

from collections.abc import Mapping

from amqlite.broker.selector import MessageFields, parse_selector

CTX = MessageFields(
    message_id="ID:m1", priority=4, enqueued_at=1_700_000_000_000, expires_at=0,
    persistent=True, destination="/queue/orders",
)


def ev(text: str, headers: Mapping[str, str] | None = None,
       ctx: MessageFields = CTX) -> bool | None:
    return parse_selector(text).evaluate(headers or {}, ctx)
