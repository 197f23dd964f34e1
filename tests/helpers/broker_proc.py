"""Harness for end-to-end tests: real `amqlite start` processes and real STOMP clients.

One import for the tests: the broker processes live in ``broker_process``, the stomp.py
clients in ``stomp_clients`` and the hand-written STOMP socket in ``raw_stomp``; this
module re-exports their public names so a test needs only ``tests.helpers.broker_proc``.
"""

from __future__ import annotations

from tests.helpers.broker_process import (
    ACTIVE_FACTORIES,
    HOST,
    LOG_TAIL_LINES,
    PAIR_LOCK_POLL,
    REPO_ROOT,
    START_TIMEOUT,
    WAIT,
    BrokerFactory,
    BrokerProcess,
    amqlite_command,
    cli_env,
    never_serves,
    password_hash,
    start_pair,
    unique,
    wait_one_serving,
)
from tests.helpers.raw_stomp import (
    CLOSE_DEADLINE,
    RawFrame,
    RawStomp,
    assert_error_then_closed,
    format_frames,
)
from tests.helpers.stomp_clients import (
    CONNECTIONS,
    LISTENER,
    Client,
    ClientPool,
    Collector,
    ConnectRefused,
    LoadProducer,
    StompConnection,
    ack_id,
    assert_broker_serves,
    open_client,
    send_many,
    send_with_receipt,
    wait_receipt,
    wait_receipts,
)

__all__ = [
    "ACTIVE_FACTORIES",
    "CLOSE_DEADLINE",
    "CONNECTIONS",
    "HOST",
    "LISTENER",
    "LOG_TAIL_LINES",
    "PAIR_LOCK_POLL",
    "REPO_ROOT",
    "START_TIMEOUT",
    "WAIT",
    "BrokerFactory",
    "BrokerProcess",
    "Client",
    "ClientPool",
    "Collector",
    "ConnectRefused",
    "LoadProducer",
    "RawFrame",
    "RawStomp",
    "StompConnection",
    "ack_id",
    "amqlite_command",
    "assert_broker_serves",
    "assert_error_then_closed",
    "cli_env",
    "format_frames",
    "never_serves",
    "open_client",
    "password_hash",
    "send_many",
    "send_with_receipt",
    "start_pair",
    "unique",
    "wait_one_serving",
    "wait_receipt",
    "wait_receipts",
]
