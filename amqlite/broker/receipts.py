"""The one write-and-receipt path: how a frame that writes is answered.

Every RECEIPT the broker sends leaves from here, and so does the ERROR of a frame
whose own data the store refused. The rule for what a RECEIPT waits for:

**A frame's RECEIPT waits for its own unit, else for a commit point behind it.**
The unit is the span of the batch that holds the frame's own data (a SEND's or a
COMMIT's messages and ack rows, a durable SUBSCRIBE's row, an ABORT's producer
identities; ``store.write_buffer.WriteUnit``): the store takes it whole or refuses
it whole, and a refusal is that client's ERROR, never anyone else's. A frame with
no unit (an ACK, an UNSUBSCRIBE) stages a commit point after everything it staged.
A frame that writes nothing (BEGIN, a SEND or ACK inside a transaction, a
non-persistent SEND) is answered at once (``answer_now``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from store.api import BatchResult
from store.write_buffer import WriteUnit

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.session import Client, Session

log = logging.getLogger("amqlite.broker")

#: The ERROR body when the store refused a frame's data (its own words stay in
#: the broker's log: they name tables and columns).
REJECTED_DETAIL = ("A value in this frame cannot be stored (too long, out of range or not "
                   "representable); nothing of the frame was stored.")

#: Told the store's outcome for a frame's writes: its result, or None (refused or failed).
OnResult = Callable[[BatchResult | None], None]


def answer(broker: Broker, session: Session, receipt: str | None,
           unit: WriteUnit[Client] | None = None, on_result: OnResult | None = None,
           pending_bytes: int = 0) -> None:
    """Answer the frame being handled once its writes are durable: ``on_result`` runs
    first (routing what committed), then the RECEIPT goes out. When the store refused
    ``unit``, its client gets an ERROR carrying the receipt-id before ``on_result``
    runs, so nothing that ``on_result`` hands back is delivered to that connection.
    ``pending_bytes``: persistent message bytes the session holds until then."""
    conn = session.conn
    session.commit_started(pending_bytes)
    if pending_bytes:  # held in the broker-wide budget too, until the commit
        broker.memory.hold_pending(conn, pending_bytes)
    if unit is not None:
        unit.receipt = receipt

    def completed(result: BatchResult | None) -> None:
        session.commit_finished(pending_bytes)
        if pending_bytes:
            broker.memory.release_pending(conn, pending_bytes, session.pending_bytes)
        if result is None and unit is not None and unit.rejected is not None:
            reject(unit)
        if on_result is not None:
            on_result(result)
        if result is not None and receipt is not None and not conn.closed:
            conn.write_receipt(receipt)

    if unit is None:
        broker.writes.stage_point(completed)
    else:
        broker.writes.stage_unit(unit, completed)


def answer_now(conn: Client, receipt: str | None) -> None:
    """Answer a frame that wrote nothing (or whose writes are already durable)."""
    if receipt is not None and not conn.closed:
        conn.write_receipt(receipt)


def reject(unit: WriteUnit[Client]) -> None:
    """The store refused the data of one client frame: nothing of it was written.
    That client gets an ERROR (with its receipt-id) and is closed; everyone else
    goes on, and the node stays master."""
    conn = unit.conn
    log.warning("the store refused a frame's data%s: %s",
                f" (client {conn.client_id})" if conn and conn.client_id else "",
                unit.rejected)
    if conn is None or conn.closed:
        return
    conn.close_with_error("the store refused this frame's data",
                          REJECTED_DETAIL, receipt=unit.receipt)
