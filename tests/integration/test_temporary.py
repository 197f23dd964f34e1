"""Issue 21, temporary destinations and idle queues, against real broker processes with
stomp.py on both sides.

A requester SUBSCRIBEs to ``/temp-queue/replies`` and SENDs its request with
``reply-to:/temp-queue/replies``. The service gets the MESSAGE with the broker-wide name
``/remote-temp-queue/ID:...`` as its reply-to, SENDs its answer there, and the requester
gets it. Nobody else may SUBSCRIBE to it, nothing of it is stored, and it is deleted
with its connection: after that, a reply is an ERROR naming it and the management API
no longer lists it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from amqlite.auth import hash_password
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    RawStomp,
    assert_error_then_closed,
    unique,
)
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: How long "nothing more arrives" is watched (s).
QUIET = 0.6
PASSWORDS = {"asker": "asker-Temp-4R7", "server": "server-Temp-8K2"}
#: Entries for /queue/service only: temporary destinations need none.
RULES = """
[groups]
askers = ["asker"]
servers = ["server"]

[[authorization]]
destination = "/queue/service.>"
read = ["servers"]
write = ["askers"]
admin = ["servers"]
auto_create = true
"""


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return start_with_http(module_factory, "temporary")


@pytest.fixture(scope="module")
def secured(module_factory: BrokerFactory, tmp_path_factory: pytest.TempPathFactory
            ) -> BrokerProcess:
    path: Path = tmp_path_factory.mktemp("temp") / "users.toml"
    users = "\n".join(f'{u} = "{hash_password(p)}"' for u, p in PASSWORDS.items())
    path.write_text(f"[users]\n{users}\n{RULES}")
    return module_factory.start(name="temporary-authz",
                                env={"AMQLITE_USERS_FILE": str(path)})


def api(broker: BrokerProcess) -> Api:
    return Api(broker.http)  # type: ignore[attr-defined]


def listed(broker: BrokerProcess) -> set[str]:
    status, data = api(broker).get("/api/v1/destinations")
    assert status == 200, data
    return {d["name"] for d in data["destinations"]}


def store_rows(broker: BrokerProcess, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read the broker's embedded store behind its back (read-only)."""
    db = broker.data_dir / "amqlite.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        return list(conn.execute(query, params))


def ask(requester: Client, service: Client, queue: str, body: str,
        reply_to: str = "/temp-queue/replies", **headers: str) -> str:
    """The requester SENDs a request; the service gets it. Its reply-to, as the
    service sees it."""
    before = service.listener.count()
    requester.send(queue, body, headers={"reply-to": reply_to, **headers})
    request = service.listener.wait_messages(before + 1)[before]
    assert request.body == body
    return str(request.headers["reply-to"])


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_request_reply_round_trip(broker: BrokerProcess, clients: ClientPool,
                                  kind: str) -> None:
    queue = f"/queue/{unique('service')}"
    service = clients(broker.port)
    service.subscribe(queue, ack="client-individual")
    requester = clients(broker.port)
    requester.subscribe(f"/temp-{kind}/replies")
    reply_to = ask(requester, service, queue, "2+2?", f"/temp-{kind}/replies")
    assert reply_to.startswith(f"/remote-temp-{kind}/ID:") and reply_to.endswith(":replies")
    service.send(reply_to, "4", headers={"correlation-id": "c1"})
    got = requester.listener.wait_messages(1)
    assert got[0].body == "4" and got[0].headers["correlation-id"] == "c1"
    assert got[0].headers["destination"] == reply_to
    # Several requesters: each answer reaches its own asker only.
    other = clients(broker.port)
    other.subscribe(f"/temp-{kind}/replies")
    other_reply_to = ask(other, service, queue, "3+3?", f"/temp-{kind}/replies")
    assert other_reply_to != reply_to
    service.send(other_reply_to, "6")
    assert other.listener.wait_messages(1)[0].body == "6"
    assert requester.listener.holds_for(lambda: requester.listener.count() == 1, QUIET)


def test_a_reply_waits_in_a_temporary_queue_until_its_owner_subscribes(
        broker: BrokerProcess, clients: ClientPool) -> None:
    queue = f"/queue/{unique('service')}"
    service = clients(broker.port)
    service.subscribe(queue)
    requester = clients(broker.port)
    reply_to = ask(requester, service, queue, "later")  # not subscribed yet
    service.send(reply_to, "kept")
    assert reply_to in listed(broker)
    requester.subscribe("/temp-queue/replies")
    assert requester.listener.wait_messages(1)[0].body == "kept"


def test_deleted_with_its_connection(broker: BrokerProcess, clients: ClientPool) -> None:
    queue = f"/queue/{unique('service')}"
    service = clients(broker.port)
    service.subscribe(queue)
    requester = clients(broker.port)
    requester.subscribe("/temp-queue/replies")
    reply_to = ask(requester, service, queue, "bye")
    requester.send("/temp-queue/replies", "waiting")  # to itself: dropped with it
    assert requester.listener.wait_messages(1)[0].body == "waiting"
    requester.unsubscribe(requester.subscriptions[0])
    requester.send("/temp-queue/replies", "never read")
    assert reply_to in listed(broker)
    requester.close()
    wait_until(lambda: reply_to not in listed(broker), what=f"{reply_to} unlisted")
    service.conn.send(reply_to, "too late", headers={"receipt": "r-late"})
    assert service.listener.wait_for(lambda: bool(service.listener.errors))
    error = service.listener.error_texts()[0]
    assert reply_to in error and "does not exist" in error


def test_another_connection_cannot_subscribe(broker: BrokerProcess,
                                             clients: ClientPool) -> None:
    queue = f"/queue/{unique('service')}"
    service = clients(broker.port)
    service.subscribe(queue)
    requester = clients(broker.port)
    requester.subscribe("/temp-queue/replies")
    reply_to = ask(requester, service, queue, "mine")
    with RawStomp(broker.port) as thief:
        thief.connect()
        thief.send_frame("SUBSCRIBE", {"destination": reply_to, "id": "steal",
                                       "receipt": "r-steal"})
        error = assert_error_then_closed(thief, "SUBSCRIBE to another's temporary queue",
                                         None, receipt="r-steal")
        assert "belongs to another connection" in error.headers["message"]
    service.send(reply_to, "still mine")
    assert requester.listener.wait_messages(1)[0].body == "still mine"


def test_nothing_is_stored(broker: BrokerProcess, clients: ClientPool) -> None:
    marker = unique("temp-body")
    requester = clients(broker.port)
    requester.subscribe("/temp-queue/replies", ack="client-individual")
    requester.send("/temp-queue/replies", marker, headers={"persistent": "true"})
    got = requester.listener.wait_messages(1)[0]
    assert got.body == marker
    requester.ack(got)
    requester.send("/temp-topic/news", marker, headers={"persistent": "true"})
    # A persistent request to a real queue is stored: the check below can see rows.
    requester.send(f"/queue/{unique('stored')}", marker,
                   headers={"reply-to": "/temp-queue/replies"})
    names = [r[0] for r in store_rows(broker, "SELECT name FROM amq_destinations")]
    assert names and not [n for n in names if "temp" in n]
    bodies = store_rows(broker, "SELECT body FROM amq_messages")
    assert len([b for (b,) in bodies if marker.encode() in bytes(b)]) == 1  # /queue/'s


def test_temporary_destinations_need_no_authorization_entry(
        secured: BrokerProcess, clients: ClientPool) -> None:
    queue = f"/queue/service.{unique('q')}"
    service = clients(secured.port, username="server", passcode=PASSWORDS["server"])
    service.subscribe(queue)
    requester = clients(secured.port, username="asker", passcode=PASSWORDS["asker"])
    requester.subscribe("/temp-queue/replies")
    reply_to = ask(requester, service, queue, "allowed?")
    service.send(reply_to, "yes")  # no entry matches it: the name is the permission
    assert requester.listener.wait_messages(1)[0].body == "yes"
    with RawStomp(secured.port) as raw:  # the entries still rule everything else
        raw.connect(extra={"login": "server", "passcode": PASSWORDS["server"]})
        raw.send_frame("SEND", {"destination": "/queue/other", "receipt": "r-other"}, b"x")
        error = assert_error_then_closed(raw, "SEND outside the entries", None)
        assert "permission denied" in error.headers["message"]
