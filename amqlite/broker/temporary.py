"""Temporary destinations (issue 21): a connection's own queues and topics, deleted with
it, answered by other connections through ``reply-to``.

ActiveMQ's STOMP convention (its ``ProtocolConverter`` and ``LegacyFrameTranslator``):

- ``/temp-queue/NAME`` and ``/temp-topic/NAME`` name a destination of the connection
  that uses them. Its first SEND or SUBSCRIBE naming one creates it, and so does a SEND
  whose ``reply-to`` names one. Another connection's ``/temp-queue/NAME`` is another
  destination.
- Each gets a broker-wide name, ``/remote-temp-queue/ID:TOKEN:NAME`` (or
  ``/remote-temp-topic/...``), where TOKEN holds 128 random bits per connection. A
  SEND's ``reply-to: /temp-queue/NAME`` is rewritten to that name, so the service that
  receives the request SENDs its answer there. The MESSAGEs of a temporary destination
  carry that name as ``destination``. RabbitMQ rewrites to ``/reply-queue/amq.gen-...``
  instead.
- Only the owner may SUBSCRIBE (anyone else gets an ERROR), and not durably; anyone who
  has the name may SEND to it. The ``[[authorization]]`` entries do not apply: any login
  may create and use its own, and the unguessable name is what lets another connection
  answer.
- Its messages live in memory only: a ``persistent:true`` SEND is accepted and kept as a
  non-persistent message. Nothing is stored, so there is no destination row and the
  audit sees nothing. The byte budgets and flow control apply as to any other
  non-persistent message. A scheduled SEND (``AMQ_SCHEDULED_*``) to one is an ERROR:
  scheduled messages wait in the store.
- The end of the connection deletes them and drops what waits in them. A SEND or
  COMMIT to one that is gone (or never was) is an ERROR naming it, as ActiveMQ's
  InvalidDestinationException is.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amqlite.broker.source import Source
from amqlite.broker.subscribe import durable_name
from amqlite.validation import (
    REMOTE_TEMP_QUEUE,
    REMOTE_TEMP_TOPIC,
    TEMP_QUEUE,
    TEMP_TOPIC,
    BrokerError,
    check_destination,
    is_temporary,
)
from amqlite.wildcard import ANY_CHILD, ANY_DESCENDANT, SEPARATOR
from store.limits import DESTINATION_NAME_LENGTH

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.message import Message
    from amqlite.broker.session import Client

log = logging.getLogger("amqlite.broker")

#: Random bytes in a connection's token: 128 bits, like RabbitMQ's ``amq.gen-`` names
#: (rabbit_guid). Nobody can guess the name, so knowing it (from a reply-to) is what
#: lets another connection SEND to it.
TOKEN_BYTES = 16
#: ActiveMQ writes a connection's id as ``ID:...``, so the name shows it belongs to a
#: connection.
ID_PREFIX = "ID:"
#: Temporary destinations per connection. Request/reply needs one or a few. The
#: authorization rules that bound other destinations do not apply here, so this caps
#: what one connection can make the broker hold: a ``Source`` each, about a kilobyte.
MAX_PER_CONNECTION = 1000
#: The header a request names its answer's destination in (JMSReplyTo).
REPLY_TO = "reply-to"
#: A connection's own prefix -> the broker-wide one.
_BROKER_WIDE = {TEMP_QUEUE: REMOTE_TEMP_QUEUE, TEMP_TOPIC: REMOTE_TEMP_TOPIC}
_OWN_PREFIXES = (TEMP_QUEUE, TEMP_TOPIC)


@dataclass(eq=False, slots=True)
class Temporary:
    """One temporary destination: its broker-wide name and its owner."""

    name: str
    queue: bool  # else a topic
    owner: Client


@dataclass(slots=True)
class _Owned:
    """One connection's token and temporary destinations (by broker-wide name)."""

    token: str
    destinations: dict[str, Temporary] = field(default_factory=dict)


class Temporaries:
    """The broker's temporary destinations: by broker-wide name, and by owner (deleted
    with it)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Temporary] = {}
        self.owners: dict[Client, _Owned] = {}

    def __len__(self) -> int:
        return len(self.by_name)


def _named(name: str) -> str:
    """A client's name in an ERROR message: quoted (control characters escaped), short."""
    return repr(name[:100]) + ("..." if len(name) > 100 else "")


def _split(own_name: str) -> tuple[str, str]:
    """``/temp-queue/x`` -> ``("/temp-queue/", "x")``."""
    prefix = TEMP_QUEUE if own_name.startswith(TEMP_QUEUE) else TEMP_TOPIC
    return prefix, own_name[len(prefix):]


def _broker_wide(owned: _Owned, own_name: str) -> str:
    """``/temp-queue/x`` -> ``/remote-temp-queue/ID:TOKEN:x`` for one connection."""
    prefix, rest = _split(own_name)
    return f"{_BROKER_WIDE[prefix]}{ID_PREFIX}{owned.token}:{rest}"


def own(broker: Broker, conn: Client, own_name: str) -> Temporary:
    """The connection's temporary destination ``/temp-queue/NAME`` (or ``/temp-topic/``),
    created if new; BrokerError for a name it cannot have."""
    registry = broker.temporary
    owned = registry.owners.get(conn)
    if owned is None:
        owned = registry.owners[conn] = _Owned(secrets.token_hex(TOKEN_BYTES))
    name = _broker_wide(owned, own_name)
    found = owned.destinations.get(name)
    if found is not None:
        return found
    prefix, rest = _split(own_name)
    if not rest or any(e in (ANY_CHILD, ANY_DESCENDANT) for e in rest.split(SEPARATOR)):
        raise BrokerError(f"temporary destination {_named(own_name)}: it needs a name, "
                          f"without '*' or '>' segments (no wildcards here)")
    if len(name) > DESTINATION_NAME_LENGTH:
        room = DESTINATION_NAME_LENGTH - (len(name) - len(own_name))
        raise BrokerError(f"temporary destination of {len(own_name)} characters: at most "
                          f"{room}, so that its broker-wide name fits")
    check_destination(name)  # CR, LF, NUL
    if len(owned.destinations) >= MAX_PER_CONNECTION:
        raise BrokerError(f"too many temporary destinations: at most {MAX_PER_CONNECTION} "
                          "per connection")
    made = Temporary(name, prefix == TEMP_QUEUE, conn)
    owned.destinations[name] = made
    registry.by_name[name] = made
    if made.queue:  # memory only: never paged, never stored
        broker.queues[name] = Source(broker, name, None, stored=False)
    log.debug("temporary destination %s created for %s", name, own_name)
    return made


def existing(broker: Broker, name: str) -> Temporary:
    """The temporary destination of broker-wide ``name``; BrokerError naming it when
    it is gone (ActiveMQ's InvalidDestinationException)."""
    found = broker.temporary.by_name.get(name)
    if found is None:
        raise BrokerError(f"temporary destination {_named(name)} does not exist: it was "
                          "deleted with its connection, or never existed")
    return found


def _resolve(broker: Broker, conn: Client, destination: str) -> Temporary:
    if destination.startswith(_OWN_PREFIXES):
        return own(broker, conn, destination)
    return existing(broker, destination)


# -- hooks of the client commands (amqlite.broker.dispatch) ----------------------------
def on_send(broker: Broker, conn: Client, headers: dict[str, str]) -> bool:
    """Rewrite a SEND's temporary names in place: a ``reply-to`` that names the sender's
    own temporary destination, and the ``destination``. True when the destination is
    temporary: authorization does not apply, and the message stays in memory
    (``in_memory``)."""
    reply_to = headers.get(REPLY_TO)
    if reply_to is not None and reply_to.startswith(_OWN_PREFIXES):
        headers[REPLY_TO] = own(broker, conn, reply_to).name
    destination = headers.get("destination", "")
    if not is_temporary(destination):
        return False
    headers["destination"] = _resolve(broker, conn, destination).name
    return True


def in_memory(message: Message) -> None:
    """A message for a temporary destination is never stored, whatever ``persistent``
    said; so it cannot be scheduled (a scheduled message waits in the store)."""
    if message.plan is not None:
        raise BrokerError(f"temporary destination {_named(message.destination)}: "
                          "scheduled delivery needs a destination that is stored")
    message.persistent = False


def on_subscribe(broker: Broker, conn: Client, headers: dict[str, str]) -> bool:
    """Rewrite a SUBSCRIBE to a temporary destination to its broker-wide name, after
    checking that this connection owns it. True when the destination is temporary (then
    authorization does not apply)."""
    destination = headers.get("destination", "")
    if not is_temporary(destination):
        return False
    found = _resolve(broker, conn, destination)
    if found.owner is not conn:
        raise BrokerError(f"temporary destination {_named(destination)} belongs to another "
                          "connection: only its owner may subscribe")
    if durable_name(headers):
        raise BrokerError(f"temporary destination {_named(destination)}: a durable "
                          "subscription cannot outlive it")
    headers["destination"] = found.name
    return True


def on_unsubscribe(broker: Broker, conn: Client, headers: dict[str, str]) -> None:
    """A STOMP 1.0 UNSUBSCRIBE without ``id`` names the subscription by its destination,
    which its SUBSCRIBE had rewritten: rewrite this one too."""
    destination = headers.get("destination")
    owned = broker.temporary.owners.get(conn)
    if (owned is not None and not headers.get("id") and destination is not None
            and destination.startswith(_OWN_PREFIXES)):
        name = _broker_wide(owned, destination)
        if name in owned.destinations:
            headers["destination"] = name


def check_sends(broker: Broker, messages: Iterable[Message]) -> None:
    """Before a COMMIT applies anything: each temporary destination it sends to still
    exists (BrokerError naming the first that does not)."""
    for m in messages:
        if is_temporary(m.destination):
            existing(broker, m.destination)


# -- the end of a connection, and what comes after ----------------------------------
def connection_closed(broker: Broker, conn: Client) -> None:
    """Delete the connection's temporary destinations with what waits in them (its
    subscriptions are closed already, so what they had in flight is back in them)."""
    owned = broker.temporary.owners.pop(conn, None)
    if owned is None:
        return
    for made in owned.destinations.values():
        del broker.temporary.by_name[made.name]
        dropped = 0
        if made.queue:
            q = broker.queues.pop(made.name, None)
            if q is not None:
                dropped = len(q)
                q.discard()  # frees its bytes; producers held back for it read again
        else:
            for source in broker.topics.pop(made.name, ()):
                dropped += len(source)
                source.discard()
        broker.forget_totals(made.name)
        log.debug("temporary destination %s deleted with its connection (%d messages "
                  "dropped)", made.name, dropped)


class _Gone(Source):
    """A deleted temporary queue, for what is routed to it afterwards (a COMMIT that
    was committing when the owner left): dropped, and no producer is held back."""

    def add_nonpersistent(self, message: Message, producer: Client | None = None) -> None:
        self.broker.stats["dropped"] += 1


def gone_queue(broker: Broker, name: str) -> Source:
    """What ``Broker.queue`` gives for a temporary queue that no longer exists: a
    source that drops what it gets, never registered (nothing of it remains)."""
    return _Gone(broker, name, None, stored=False)
