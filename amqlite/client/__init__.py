"""The amqlite client: STOMP 1.2 with ActiveMQ's failover transport semantics.

``AsyncClient`` is the implementation (asyncio); ``Client`` is a blocking facade that runs
an ``AsyncClient`` on an event loop in a background thread, for scripts.

Broker URLs and options: see :mod:`amqlite.client.uri` (``tcp://``, ``failover:``,
``discovery:``, every ActiveMQ failover option with ActiveMQ's default). Reconnect timing
and URI order: :mod:`amqlite.client.reconnect` (ActiveMQ's ``doReconnect``/``doDelay``).

The package, one concern a module (each imports only those above it):

``errors``       the exceptions an application catches
``uri``          parsing broker URLs and their failover options
``messages``     what the application handles: SendResult, Message, Subscription, ...
``connection``   one TCP connection speaking STOMP through the sans-I/O protocol
``discovery``    ``discovery:`` URLs: the registry lookup and the resolver hook
``requests``     bookkeeping of requests waiting for the broker, and their replay
``reconnect``    the reconnect policy: back-off, attempt limits, the order of URIs,
                 each attempt's deadline
``attempts``     connect attempts running side by side, across passes
``failover``     the supervisor (reconnect passes, standby, priority, cluster updates)
                 and the client's state (``ClientState``)
``asyncclient``  ``AsyncClient``, the coroutine API
``blocking``     ``Client``, the blocking facade on a background loop thread

What failover guarantees
    Every persistent SEND carries ``receipt`` and the producer message identity
    ``amqlite.producerId`` + ``amqlite.producerSeq``; ``send()`` returns when the RECEIPT
    arrives, which the broker sends only after the commit. A send without RECEIPT is kept
    and, after a reconnect, written again with the *same* identity, before any newer send;
    the broker's dedup window stores it at most once and answers with a RECEIPT either way.
    While no broker is connected, sends wait (``timeout=-1``) or fail after ``timeout`` ms
    (``SendTimeoutError``; the connection is not touched). A timed-out send that was never
    written is withdrawn; one that was written stays queued with its identity, so it still
    lands exactly once. ``trackMessages=true`` also replays non-persistent sends whose
    RECEIPT is missing, oldest evicted beyond ``maxCacheSize`` bytes. Persistent sends are
    always tracked: that is what makes a RECEIPT a promise across failover.

After a reconnect
    Every subscription is sent again with its id and headers (durable ones by
    ``activemq.subscriptionName``, under the same ``client-id``: the broker lets the newer
    connection take over the client-id). Open transactions are replayed (BEGIN, their
    SENDs with the same identities, and a pending COMMIT) unless they hold ACKs, which
    cannot be replayed: then ``commit()`` raises ``TransactionRolledBackError``. An ACK/NACK
    whose RECEIPT did not come back, or an ack for a message delivered on an older
    connection, is *unconfirmed*: ``ack()`` returns False, the message is appended to
    ``unconfirmed_acks`` and ``listener.on_exception(AckNotConfirmedError)`` is called. The
    ack may have committed before the connection dropped; if it did not, the broker
    redelivers the message with ``redelivered:true``. Messages of client-ack subscriptions
    not yet taken by the application are dropped at an interruption (ActiveMQ clears them
    too) because the broker redelivers them.

Transport listener
    Any object with some of ``on_command(frame)``, ``on_exception(exc)``,
    ``on_interrupted()``, ``on_resumed()`` (see ``TransportListener``). They are called on
    the event loop (for ``Client``: on its background loop thread), so they must not block;
    a coroutine function is scheduled as a task. Exceptions they raise are logged.

Cluster updates (contract with the broker: ActiveMQ's ``updateClusterClients`` and
``rebalanceClusterClients`` in STOMP terms)
    A broker may add to a CONNECTED, RECEIPT or MESSAGE frame the headers
    ``amqlite.clusterURIs: tcp://h1:p1,tcp://h2:p2`` (comma-separated tcp URIs, the group's
    client URIs in the order it wants clients to prefer) and ``amqlite.rebalance: true``.
    With ``updateURIsSupported=true`` (default) the client tries those URIs first on every
    reconnect pass (its configured URIs stay as fallback). With ``amqlite.rebalance:true``
    and ``reconnectSupported=true`` (default) a client not connected to the first listed
    URI closes its connection and reconnects there (re-subscribing and re-sending as after
    any interruption).

Standby connections
    ``backup=true`` keeps one more connection, to the next URI in connect order, open and
    handshaken; when the active one drops the client switches to it without the reconnect
    delay. A shared-store slave does not listen, so against a master/slave pair the standby
    simply keeps retrying (with the reconnect back-off) until the slave becomes master.
    ``priorityBackup=true`` polls the priority URI (``priorityURIs``, else the first
    configured URI) while connected elsewhere and moves back to it once it accepts.
    Standby connections carry the same ``client-id``; they only ever point at another
    broker than the active connection.
"""

from __future__ import annotations

from amqlite.client.asyncclient import DISCONNECT_TIMEOUT_S, AsyncClient
from amqlite.client.blocking import Client, SyncSubscription
from amqlite.client.discovery import Resolver, register_discovery_resolver
from amqlite.client.errors import (
    AckNotConfirmedError,
    BrokerRefusedError,
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    ConnectRefusedError,
    FailoverTimeoutError,
    SendTimeoutError,
    TransactionOutcomeUnknownError,
    TransactionRolledBackError,
)
from amqlite.client.failover import ClientState
from amqlite.client.messages import (
    CLUSTER_URIS_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
    REBALANCE_HEADER,
    Interruption,
    Message,
    SendResult,
    Subscription,
    TransportListener,
    stomp_destination,
)
from amqlite.tls import ClientTls

__all__ = [
    "CLUSTER_URIS_HEADER",
    "DISCONNECT_TIMEOUT_S",
    "PRODUCER_ID_HEADER",
    "PRODUCER_SEQ_HEADER",
    "REBALANCE_HEADER",
    "AckNotConfirmedError",
    "AsyncClient",
    "BrokerRefusedError",
    "Client",
    "ClientClosedError",
    "ClientError",
    "ClientState",
    "ClientTls",
    "ConnectRefusedError",
    "ConnectionFailedError",
    "FailoverTimeoutError",
    "Interruption",
    "Message",
    "Resolver",
    "SendResult",
    "SendTimeoutError",
    "Subscription",
    "SyncSubscription",
    "TransactionOutcomeUnknownError",
    "TransactionRolledBackError",
    "TransportListener",
    "register_discovery_resolver",
    "stomp_destination",
]
