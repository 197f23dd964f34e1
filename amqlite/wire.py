"""The wire vocabulary: every name and number both ends of a STOMP connection agree on.

One place for what the codec, protocol, broker, server, client, settings and bench
would otherwise each spell out: protocol versions, ack modes, amqlite's own headers and
the default port. It sits on the lowest floor (it imports nothing), so every layer can
import it. The Spark audit keeps its own copy of the producer identity headers
(``spark/audit/limits.py``: it imports only pyspark and the standard library);
``tests/unit/test_wire.py`` checks the copy agrees.
"""

from __future__ import annotations

__all__ = [
    "ACK_AUTO",
    "ACK_CLIENT",
    "ACK_CLIENT_INDIVIDUAL",
    "ACK_MODES",
    "AMQ_CONSUMER_PRIORITY",
    "AMQ_EXCLUSIVE",
    "AMQ_GROUP_FIRST",
    "AMQ_GROUP_ID",
    "AMQ_GROUP_SEQ",
    "AMQ_NO_LOCAL",
    "CLUSTER_UPDATE_RECEIPT",
    "CLUSTER_URIS_HEADER",
    "DEFAULT_STOMP_PORT",
    "DEFAULT_WSS_PORT",
    "DEFAULT_WS_PORT",
    "DELIVERY_COUNT_HEADER",
    "OMITTED_HEADERS_HEADER",
    "ORIGINAL_DESTINATION",
    "PRODUCER_ID_HEADER",
    "PRODUCER_SEQ_HEADER",
    "REBALANCE_HEADER",
    "STOMP_1_0",
    "STOMP_1_1",
    "STOMP_1_2",
    "SUPPORTED_VERSIONS",
    "WS_PATH",
    "WS_SUBPROTOCOLS",
]

# -- protocol versions (the ``accept-version`` / ``version`` values) -------------------
STOMP_1_0 = "1.0"
STOMP_1_1 = "1.1"
STOMP_1_2 = "1.2"
#: Every version the codec and protocol speak, oldest first.
SUPPORTED_VERSIONS: tuple[str, ...] = (STOMP_1_0, STOMP_1_1, STOMP_1_2)

# -- ack modes (SUBSCRIBE's ``ack`` header) ---------------------------------------------
#: The spec's default when SUBSCRIBE has no ``ack`` header.
ACK_AUTO = "auto"
ACK_CLIENT = "client"
#: 1.1+ in the spec; ActiveMQ (and we) accept it from 1.0 clients too.
ACK_CLIENT_INDIVIDUAL = "client-individual"
ACK_MODES: tuple[str, ...] = (ACK_AUTO, ACK_CLIENT, ACK_CLIENT_INDIVIDUAL)

# -- amqlite's own headers ---------------------------------------------------------------
#: The producer message identity (SEND): the broker's dedup window is keyed by it, and
#: the Spark audit groups by it.
PRODUCER_ID_HEADER = "amqlite.producerId"
PRODUCER_SEQ_HEADER = "amqlite.producerSeq"
#: MESSAGE: how many times this message was delivered, on a redelivery.
DELIVERY_COUNT_HEADER = "amqlite.deliveryCount"
#: MESSAGE to a consumer whose STOMP version cannot carry some of the message's headers
#: (a LF or ':' for 1.0, a CR for 1.0 and 1.1): those are left out and named here,
#: percent-encoded and comma-separated (README.md, "STOMP surface").
OMITTED_HEADERS_HEADER = "amqlite.omittedHeaders"
#: MESSAGE of a dead letter (and an operator's retry reads it): where it was first sent.
#: Only the broker sets it: a SEND's own is removed, so a retry cannot be steered.
ORIGINAL_DESTINATION = "original-destination"

# -- ActiveMQ's headers amqlite speaks too (not amqlite.*: named AMQ_*) -----------------
#: Message groups (SEND; JMS names): a group is pinned to one consumer; a sequence of
#: -1 closes it; the first message of a group a consumer gets says so.
AMQ_GROUP_ID = "JMSXGroupID"
AMQ_GROUP_SEQ = "JMSXGroupSeq"
AMQ_GROUP_FIRST = "JMSXGroupFirstForConsumer"
#: ActiveMQ's consumer options (SUBSCRIBE).
AMQ_EXCLUSIVE = "activemq.exclusive"
AMQ_CONSUMER_PRIORITY = "activemq.priority"
AMQ_NO_LOCAL = "activemq.noLocal"
#: CONNECTED / RECEIPT, broker -> client: the group's URIs, master first (ActiveMQ's
#: updateClusterClients), and whether clients should reconnect to spread out.
CLUSTER_URIS_HEADER = "amqlite.clusterURIs"
REBALANCE_HEADER = "amqlite.rebalance"
#: The ``receipt-id`` of a RECEIPT no client asked for, carrying a cluster update.
CLUSTER_UPDATE_RECEIPT = "amqlite.cluster-update"

# -- ports -------------------------------------------------------------------------------
#: STOMP's IANA-registered port, what ActiveMQ's stomp connector uses: the broker's
#: default listener and the client's default when a URI names none (docs/design.md,
#: "STOMP surface").
DEFAULT_STOMP_PORT = 61613
#: The management HTTP listener: ActiveMQ's web console port, on loopback.
DEFAULT_HTTP_PORT = 8161
#: STOMP over WebSocket: RabbitMQ Web-STOMP's ports (15674 ws://, 15673 wss://) and
#: path, so a page written for RabbitMQ (``ws://host:15674/ws``) needs no change but the
#: host (docs/websocket.md). ActiveMQ's 61614 serves any path.
DEFAULT_WS_PORT = 15674
DEFAULT_WSS_PORT = 15673
WS_PATH = "/ws"
#: WebSocket subprotocols (Sec-WebSocket-Protocol) -> the STOMP version each names, as
#: stompjs, RabbitMQ and ActiveMQ spell them.
WS_SUBPROTOCOLS = {"v10.stomp": STOMP_1_0, "v11.stomp": STOMP_1_1, "v12.stomp": STOMP_1_2}

# -- management HTTP API -----------------------------------------------------------------
#: Header a state-changing request must carry: a cross-site form or image cannot set it,
#: and a cross-site script that tries needs a CORS preflight the API never answers.
CSRF_HEADER = "X-Requested-By"
