"""The rows a batch's messages become, as DB-API tuples: shared by the step-by-step
path (``store.batch_commit``) and SQLite's (``store.sqlite_batch``), so that both
write the same."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from store.api import BatchResult, NewMessage


def fresh_only(inserts: Sequence[NewMessage], identities: Sequence[NewMessage],
               stored: set[str], result: BatchResult
               ) -> tuple[list[NewMessage], list[NewMessage]]:
    """The inserts, and the identities with a key, whose key is neither ``stored``
    nor taken by one earlier in the batch (inserts first, then identities: the first
    wins). Those dropped are noted in ``result``."""
    seen: set[str] = set()

    def fresh(x: NewMessage) -> bool:
        k = x.dedup_key
        if k is None:
            return True
        if k in stored or k in seen:
            result.duplicates.add(k)
            result.duplicate_ids.add(x.id)
            return False
        seen.add(k)
        return True

    kept = [x for x in inserts if fresh(x)]
    # An identity without a key identifies nothing.
    return kept, [x for x in identities if x.dedup_key is not None and fresh(x)]


def message_row(g: str, epoch: int, x: NewMessage, now: int,
                encode_headers: Callable[[dict[str, str]], str]) -> tuple[Any, ...]:
    """``x`` in ``Statements.ins_msg``'s column order."""
    return (g, x.id, x.destination_id, x.message_id, x.producer_id, x.producer_seq,
            x.dedup_key, x.priority, x.expires_at, x.enqueued_at or now, x.delivery_count,
            epoch if x.delivery_count else None, encode_headers(x.headers), x.body,
            x.deliver_at or None, x.schedule)
