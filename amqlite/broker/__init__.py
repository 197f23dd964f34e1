"""The broker: destinations, subscriptions, dispatch, acknowledgements, transactions.

One concern a module:

* ``message`` -- the message model and the SEND that makes one;
* ``memory`` -- the byte budgets and the producers held back for them;
* ``source`` -- queues and topic subscriptions: ordered backlogs, paging;
* ``subscription`` -- subscriptions and their deliveries (credit, MESSAGE frames);
* ``session`` -- what the broker needs of a client, its session and transactions;
* ``dispatch`` -- one handler per client command (a table);
* ``receipts`` -- the one write-and-receipt path (what a RECEIPT waits for);
* ``send`` -- SEND and COMMIT: staged in one unit, routed once committed;
* ``acks`` -- ACK/NACK, redelivery, dead letters, ACKs in transactions;
* ``subscribe`` -- SUBSCRIBE/UNSUBSCRIBE;
* ``destinations`` -- destination rows, durable subscriptions, deleting one;
* ``routing`` -- where a visible message goes (topic wildcards and selectors too);
* ``selector`` + ``selector_eval`` -- ActiveMQ's JMS selectors, sans-I/O: parse, evaluate,
  the terms a store can filter on;
* ``selective`` -- selectors on a queue: the store scan of a selective consumer;
* ``choice`` -- which consumer of a queue gets a message: selectors, message groups,
  exclusive and priority consumers;
* ``wildcard_queues`` -- one SUBSCRIBE to ``/queue/A.*`` over every matching queue;
* ``schedule`` -- ActiveMQ's ``AMQ_SCHEDULED_*`` headers, pure: due times and plans;
* ``scheduler`` -- scheduled delivery: stored with a due time, one timer, copies made
  deliverable in fenced batches when due;
* ``temporary`` -- a connection's temporary destinations and their reply-to names;
* ``inactive`` -- deleting queues idle for ``gc_inactive_destinations``;
* ``core`` -- ``Broker``: the state, connections, authorization;
* ``operations`` -- the operator API (``Operations``: purge, move, retry, delete,
  remove a durable subscription, close a connection, send, list and cancel scheduled
  messages): the only way the management API changes anything.

* ``limits`` -- bounded queues of a policy (max_length, max_bytes, overflow) and the TTL
  a policy gives a SEND;
* ``redelivery`` -- a NACKed message's redelivery delay (back-off), stored as a due time.

Destination wildcards (``amqlite.wildcard``) sit one floor down: authorization shares
them, and so do the policies per destination (``amqlite.policy``: which one applies).
"""

from amqlite.broker.core import Broker
from amqlite.broker.destinations import ForgottenDestination
from amqlite.broker.memory import MemoryBudget
from amqlite.broker.message import Message, checked_send, message_size, now_ms
from amqlite.broker.operations import ErrorKind, OperationError, Operations
from amqlite.broker.session import MAX_OPEN_TRANSACTIONS, Client, Session, Transaction
from amqlite.broker.source import DurableSource, Source, TopicSubscriptionSource
from amqlite.broker.subscription import MAX_INFLIGHT_BYTES, Delivery, Subscription
from amqlite.validation import BrokerError

__all__ = [
    "MAX_INFLIGHT_BYTES",
    "MAX_OPEN_TRANSACTIONS",
    "Broker",
    "BrokerError",
    "Client",
    "Delivery",
    "DurableSource",
    "ErrorKind",
    "ForgottenDestination",
    "MemoryBudget",
    "Message",
    "OperationError",
    "Operations",
    "Session",
    "Source",
    "Subscription",
    "TopicSubscriptionSource",
    "Transaction",
    "checked_send",
    "message_size",
    "now_ms",
]
