"""Unit tests of the STOMP heart-beat arithmetic: negotiation, parsing, receive deadline."""

from __future__ import annotations

import pytest

from amqlite.codec import ProtocolError
from amqlite.protocol import (
    HEARTBEAT_GRACE,
    MAX_HEARTBEAT_MS,
    Heartbeat,
    negotiate_heartbeat,
    parse_heartbeat,
    receive_deadline_ms,
)

# --- heart-beat arithmetic ------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "server", "server_view"),
    [
        ((0, 0), (0, 0), Heartbeat(0, 0)),
        ((1000, 0), (0, 0), Heartbeat(0, 0)),  # server does not want client beats
        ((0, 0), (1000, 1000), Heartbeat(0, 0)),  # client neither sends nor wants beats
        ((1000, 0), (0, 2000), Heartbeat(send_ms=0, expect_ms=2000)),
        ((3000, 0), (0, 2000), Heartbeat(send_ms=0, expect_ms=3000)),
        ((0, 500), (1000, 0), Heartbeat(send_ms=1000, expect_ms=0)),
        ((0, 5000), (1000, 0), Heartbeat(send_ms=5000, expect_ms=0)),
        ((1000, 2000), (3000, 500), Heartbeat(send_ms=3000, expect_ms=1000)),
        ((10000, 10000), (10000, 10000), Heartbeat(10000, 10000)),
    ],
)
def test_heartbeat_negotiation_table(client: tuple[int, int], server: tuple[int, int],
                                     server_view: Heartbeat) -> None:
    assert negotiate_heartbeat(client, server) == server_view
    assert negotiate_heartbeat(client, server, role="client") == Heartbeat(
        send_ms=server_view.expect_ms, expect_ms=server_view.send_ms)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(None, (0, 0)), ("0,0", (0, 0)), ("1000,2500", (1000, 2500)),
     (f"{MAX_HEARTBEAT_MS},0", (MAX_HEARTBEAT_MS, 0))],
)
def test_parse_heartbeat(value: str | None, parsed: tuple[int, int]) -> None:
    assert parse_heartbeat(value) == parsed


def test_parse_heartbeat_rejects_values_over_the_maximum() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_heartbeat(f"{MAX_HEARTBEAT_MS + 1},0")
    assert info.value.fault == "remote"


def test_receive_deadline_uses_the_grace_factor() -> None:
    assert HEARTBEAT_GRACE == 2.0
    assert receive_deadline_ms(Heartbeat(send_ms=0, expect_ms=1000)) == 2000
    assert receive_deadline_ms(Heartbeat(send_ms=0, expect_ms=333), grace=1.5) == 500
    assert receive_deadline_ms(Heartbeat(send_ms=1000, expect_ms=0)) is None
