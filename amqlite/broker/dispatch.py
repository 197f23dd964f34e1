"""Dispatch as a table: one handler per client command, as RabbitMQ's
``rabbit_stomp_processor`` has one clause per command.

A handler gets the broker, the connection's session and the frame; it raises
``BrokerError`` for a client mistake (an ERROR to that client only, nothing
applied) and answers the frame through ``amqlite.broker.receipts``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from amqlite.authz import Permission
from amqlite.broker import acks, limits, receipts, send, subscribe
from amqlite.broker import temporary as temporaries
from amqlite.broker.message import checked_send
from amqlite.broker.session import MAX_OPEN_TRANSACTIONS, Session, Transaction
from amqlite.codec import Frame
from amqlite.validation import BrokerError
from amqlite.wildcard import is_wildcard

if TYPE_CHECKING:
    from amqlite.broker.core import Broker

Handler = Callable[["Broker", Session, Frame], None]


def transaction(session: Session, tx: str) -> Transaction:
    try:
        return session.transactions[tx]
    except KeyError:
        raise BrokerError(f"unknown transaction {tx}") from None


def _hold(broker: Broker, session: Session, open_tx: Transaction, frame: Frame,
          name: str) -> None:
    """Count a transaction's frame against its limits and the memory budget (the
    broker-wide one and the connection's share); BrokerError, nothing held, past them."""
    size = open_tx.add(frame, name)
    broker.memory.hold_transaction(session, size)
    open_tx.size += size


def on_send(broker: Broker, session: Session, frame: Frame) -> None:
    h = frame.headers
    # Temporary names become broker-wide ones (the reply-to too); no ACL applies to them.
    temporary = temporaries.on_send(broker, session.conn, h)
    if broker.authz is not None and not temporary:
        broker.authorize(session.conn, h.get("destination", ""), Permission.WRITE)
    tx = h.get("transaction")
    open_tx = None if tx is None else transaction(session, tx)
    message = checked_send(frame)  # an invalid SEND is refused now
    if temporary:
        temporaries.in_memory(message)
    if tx is None or open_tx is None:
        send.send(broker, session, [message], h.get("receipt"))
        return
    _hold(broker, session, open_tx, frame, tx)
    open_tx.sends.append(message)
    receipts.answer_now(session.conn, h.get("receipt"))


def on_ack(broker: Broker, session: Session, frame: Frame) -> None:
    """ACK and NACK."""
    tx = frame.headers.get("transaction")
    if tx is None:
        acks.ack(broker, session, frame.command, frame, frame.headers.get("receipt"))
        return
    open_tx = transaction(session, tx)
    sub, message_id = acks.find_delivery(session, frame)  # must await acknowledgement now
    _hold(broker, session, open_tx, frame, tx)
    open_tx.acks.append((frame.command, frame))
    if frame.command == "ACK":
        acks.hold(sub, message_id, open_tx)
    receipts.answer_now(session.conn, frame.headers.get("receipt"))


def on_subscribe(broker: Broker, session: Session, frame: Frame) -> None:
    destination = frame.headers.get("destination", "")
    # A wildcard is checked per concrete destination as messages come (routing); a
    # pattern is no destination to create. A temporary one is its owner's alone.
    if temporaries.on_subscribe(broker, session.conn, frame.headers):
        pass
    elif broker.authz is not None and not is_wildcard(destination):
        broker.authorize(session.conn, destination, Permission.READ)
    subscribe.subscribe(broker, session, frame)


def on_unsubscribe(broker: Broker, session: Session, frame: Frame) -> None:
    temporaries.on_unsubscribe(broker, session.conn, frame.headers)
    subscribe.unsubscribe(broker, session, frame)


def on_begin(broker: Broker, session: Session, frame: Frame) -> None:
    tx = frame.headers["transaction"]
    if tx in session.transactions:
        raise BrokerError(f"transaction {tx} already started")
    if len(session.transactions) >= MAX_OPEN_TRANSACTIONS:
        raise BrokerError(f"too many open transactions: at most "
                          f"{MAX_OPEN_TRANSACTIONS} per connection")
    session.transactions[tx] = Transaction()
    receipts.answer_now(session.conn, frame.headers.get("receipt"))


def on_commit(broker: Broker, session: Session, frame: Frame) -> None:
    name = frame.headers["transaction"]
    tx = transaction(session, name)
    # Everything is checked before anything is applied; on failure the
    # transaction stays open and is aborted when the ERROR closes the connection.
    acks.check_commit(session, tx)
    temporaries.check_sends(broker, tx.sends)
    if tx.sends and broker.policies.any:  # a full queue refuses the COMMIT whole
        limits.check_send(broker, tx.sends)
    del session.transactions[name]
    broker.memory.release_transaction(session, tx.size)
    send.commit(broker, session, tx, frame.headers.get("receipt"))


def on_abort(broker: Broker, session: Session, frame: Frame) -> None:
    name = frame.headers["transaction"]
    tx = transaction(session, name)
    del session.transactions[name]
    send.abort(broker, session, tx, frame.headers.get("receipt"))


def on_disconnect(broker: Broker, session: Session, frame: Frame) -> None:
    """Answered once every write the connection started is durable."""
    conn = session.conn
    receipt = frame.headers.get("receipt")
    broker.abort_all(session)

    def disconnected() -> None:
        receipts.answer_now(conn, receipt)
        broker.detach(conn)
        conn.close()

    session.when_idle(disconnected)


#: Every command a connected client may send to the broker (CONNECT and heart-beats
#: stay in ``amqlite.protocol``).
HANDLERS: dict[str, Handler] = {
    "SEND": on_send,
    "ACK": on_ack,
    "NACK": on_ack,
    "SUBSCRIBE": on_subscribe,
    "UNSUBSCRIBE": on_unsubscribe,
    "BEGIN": on_begin,
    "COMMIT": on_commit,
    "ABORT": on_abort,
    "DISCONNECT": on_disconnect,
}
