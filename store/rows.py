"""The rows a batch's messages become, as DB-API tuples, and its deliveries grouped
per statement: shared by the step-by-step path (``store.batch_commit``) and SQLite's
(``store.sqlite_batch``), so that both write the same."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from store.api import Batch, BatchResult, NewMessage


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


def deliveries_by_times(batch: Batch) -> dict[tuple[int | None, int], list[int]]:
    """The batch's deliveries of messages it does not also ack, as message ids by
    (subscription, times delivered in this batch): one UPDATE each."""
    acked = set(batch.acks)
    counts = Counter(r for r in batch.deliveries if r not in acked)
    groups: defaultdict[tuple[int | None, int], list[int]] = defaultdict(list)
    for (sid, mid), n in counts.items():
        groups[(sid, n)].append(mid)
    return groups
