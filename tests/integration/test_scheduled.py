"""Issue 21, scheduled delivery: ActiveMQ's AMQ_SCHEDULED_DELAY/PERIOD/REPEAT/CRON headers,
against real broker processes on SQLite and PostgreSQL with stomp.py as the client.

A scheduled message arrives not before its time and after it; period and repeat make
their copies; a cron is stored and listed (a minute is too slow to wait for: the cron
path is in tests/broker/test_scheduled.py with a clock of the test's own); a bad header
is an ERROR naming it and stores nothing; operators list and cancel through the HTTP API
and the CLI; /metrics counts them. Two nodes on one store: SIGKILL the master with
messages due a second or two ahead, and the new master delivers each exactly once, at or
after its time.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

import pytest
import stomp
from stomp.utils import Frame

from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    RawStomp,
    assert_error_then_closed,
    start_pair,
    unique,
)
from tests.helpers.cluster import amqlite as run_amqlite
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: How long "nothing more arrives" is watched (s).
QUIET = 0.6
#: An hour: due long after any test ends.
LATER = "3600000"


class Arrivals(stomp.ConnectionListener):
    """When each MESSAGE came (wall clock, as the broker's due times are)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: list[tuple[float, Frame]] = []

    def on_message(self, frame: Frame) -> None:
        with self.lock:
            self.at.append((time.time(), frame))

    def snapshot(self) -> list[tuple[float, Frame]]:
        with self.lock:
            return list(self.at)


def timed(client: Client) -> Arrivals:
    arrivals = Arrivals()
    client.conn.set_listener("arrivals", arrivals)
    return arrivals


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def broker(request: pytest.FixtureRequest, module_factory: BrokerFactory) -> BrokerProcess:
    name = "sched-sqlite" if request.param == "sqlite" else "sched-pg"
    return start_with_http(module_factory, name, extra_args=store_args(request.param, request))


@pytest.fixture
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http)  # type: ignore[attr-defined]


def listed(api: Api, destination: str) -> list[dict[str, Any]]:
    data = api.ok("GET", f"/api/v1/scheduled?destination={destination}&limit=500")
    return data["scheduled"]  # type: ignore[no-any-return]


def amqlite(broker: BrokerProcess, *args: str, check: bool = True) -> Any:
    proc = run_amqlite(*args, "--url", broker.http, "--json")  # type: ignore[attr-defined]
    assert "Traceback" not in proc.stderr
    if check:
        assert proc.returncode == 0, f"amqlite {' '.join(args)}: {proc.stderr}"
        return json.loads(proc.stdout)
    return proc


def test_a_delayed_message_arrives_not_before_its_time(broker: BrokerProcess,
                                                        clients: ClientPool) -> None:
    queue = f"/queue/{unique('delay')}"
    consumer = clients(broker.port)
    arrivals = timed(consumer)
    consumer.subscribe(queue)
    producer = clients(broker.port)
    before = time.time()
    producer.send(queue, "in a second", headers={"AMQ_SCHEDULED_DELAY": "1000",
                                                "colour": "blue"})
    producer.send(queue, "now")
    [now] = consumer.listener.wait_messages(1)
    assert now.body == "now"  # the scheduled one is stored, not in the queue's way
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1,
                                       before + 0.8 - time.time())
    got = consumer.listener.wait_messages(2)
    [(at, frame)] = [(t, f) for t, f in arrivals.snapshot() if f.body == "in a second"]
    assert at >= before + 1.0, at - before
    assert frame.headers["colour"] == "blue" and "AMQ_SCHEDULED_DELAY" not in frame.headers
    assert frame.headers["scheduledJobId"] == frame.headers["message-id"]
    assert [m.body for m in got] == ["now", "in a second"]


def test_period_and_repeat_make_three_copies(broker: BrokerProcess,
                                             clients: ClientPool) -> None:
    """ActiveMQ's documented example scaled down: delay 300 ms, period 200 ms, repeat 2."""
    queue = f"/queue/{unique('repeat')}"
    consumer = clients(broker.port)
    arrivals = timed(consumer)
    consumer.subscribe(queue)
    before = time.time()
    clients(broker.port).send(queue, "tick", headers={
        "AMQ_SCHEDULED_DELAY": "300", "AMQ_SCHEDULED_PERIOD": "200",
        "AMQ_SCHEDULED_REPEAT": "2"})
    frames = consumer.listener.wait_messages(3)
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 3, QUIET)
    times = [t - before for t, _ in arrivals.snapshot()]
    assert times[0] >= 0.3 and times[1] >= 0.5 and times[2] >= 0.7, times
    assert len({f.headers["message-id"] for f in frames}) == 3
    assert len({f.headers["scheduledJobId"] for f in frames}) == 1


def test_a_cron_message_is_stored_listed_and_cancelled(broker: BrokerProcess, api: Api,
                                                       clients: ClientPool) -> None:
    queue = f"/queue/{unique('cron')}"
    clients(broker.port).send(queue, "new year", headers={
        "AMQ_SCHEDULED_CRON": "0 0 1 1 *", "AMQ_SCHEDULED_REPEAT": "1",
        "AMQ_SCHEDULED_PERIOD": "60000"})
    [row] = listed(api, queue)
    assert row["schedule"]["cron"] == "0 0 1 1 *" and row["schedule"]["repeat"] == 1
    assert row["body"] == "new year" and row["destination"] == queue
    assert time.gmtime(row["deliver_at"] / 1000)[1:6] == (1, 1, 0, 1, 0)  # Jan 1, 00:01
    assert "AMQ_SCHEDULED_CRON" not in row["headers"]
    cli = amqlite(broker, "scheduled", "list", queue)
    assert [r["id"] for r in cli["scheduled"]] == [row["id"]] and cli["total"] == 1
    text = run_amqlite("scheduled", "list", queue, "--url", broker.http).stdout  # type: ignore[attr-defined]
    header, line = text.splitlines()
    assert header.split()[:3] == ["id", "destination", "due"]
    assert line.split()[:2] == [str(row["id"]), queue]
    assert "cron '0 0 1 1 *'" in line
    cancelled = amqlite(broker, "scheduled", "cancel", str(row["id"]))
    assert cancelled == {"cancelled": 1, "id": row["id"], "message_id": row["message_id"],
                         "destination": queue}
    assert listed(api, queue) == []
    again = amqlite(broker, "scheduled", "cancel", str(row["id"]), check=False)
    assert again.returncode == 1 and "404" in again.stderr


@pytest.mark.parametrize(("header", "value"), [
    ("AMQ_SCHEDULED_DELAY", "-5"), ("AMQ_SCHEDULED_PERIOD", "0"),
    ("AMQ_SCHEDULED_REPEAT", "1001"), ("AMQ_SCHEDULED_CRON", "0 25 * * *"),
])
def test_a_bad_header_is_an_error_naming_it_and_nothing_is_stored(
        broker: BrokerProcess, api: Api, clients: ClientPool, header: str,
        value: str) -> None:
    queue = f"/queue/{unique('bad')}"
    headers = {"destination": queue, "receipt": "r1", header: value}
    if header == "AMQ_SCHEDULED_REPEAT":
        headers["AMQ_SCHEDULED_DELAY"] = "10"
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_frame("SEND", headers, b"refused")
        error = assert_error_then_closed(raw, f"{header}: {value}", None, receipt="r1")
        said = error.headers.get("message", "") + error.body.decode()
        assert header in said, said
    assert api.get(f"/api/v1/destinations{queue}")[0] == 404  # no row: nothing stored
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    assert consumer.listener.wait_quiet(QUIET, timeout=5)
    assert consumer.listener.count() == 0


def test_the_http_api_lists_cancels_and_metrics_count(broker: BrokerProcess, api: Api,
                                                       clients: ClientPool) -> None:
    queue, topic = f"/queue/{unique('api')}", f"/topic/{unique('api-t')}"
    producer = clients(broker.port)
    for i in range(2):
        producer.send(queue, f"later-{i}", headers={"AMQ_SCHEDULED_DELAY": LATER})
    producer.send(topic, "to the topic", headers={"AMQ_SCHEDULED_PERIOD": LATER})
    rows = listed(api, queue)
    assert [r["body"] for r in rows] == ["later-0", "later-1"]
    assert [r["destination"] for r in listed(api, topic)] == [topic]
    everything = api.ok("GET", "/api/v1/scheduled?limit=500")
    assert {r["id"] for r in rows} <= {r["id"] for r in everything["scheduled"]}
    assert api.get("/api/v1/scheduled?limit=0")[0] == 400

    def scraped(n: int) -> bool:
        text = api.get("/metrics")[1]
        return f'amqlite_scheduled_messages{{destination="{queue}"}} {n}.0' in text
    wait_until(lambda: scraped(2), what="2 scheduled in /metrics")
    assert api.destination(queue)["scheduled"] == 2  # type: ignore[index]
    assert api.destination(queue)["waiting"] == 0  # type: ignore[index]

    first = rows[0]["id"]
    status = api.call("DELETE", f"/api/v1/scheduled/{first}", csrf=False)[0]
    assert status == 403  # the CSRF header, as for every state change
    assert api.ok("DELETE", f"/api/v1/scheduled/{first}")["cancelled"] == 1
    assert api.delete(f"/api/v1/scheduled/{first}")[0] == 404
    assert api.delete("/api/v1/scheduled/not-a-number")[0] == 400
    # An ordinary message is not a scheduled one: neither cancelled nor deleted as one.
    producer.send(queue, "plain")
    [plain] = api.ok("GET", f"/api/v1/messages{queue}")["messages"]
    assert api.delete(f"/api/v1/scheduled/{plain['id']}")[0] == 404
    assert api.delete(f"/api/v1/message/{rows[1]['id']}")[0] == 409
    wait_until(lambda: scraped(1), what="1 scheduled in /metrics")
    assert [r["body"] for r in listed(api, queue)] == ["later-1"]


def test_a_queue_with_only_scheduled_rows_is_found_by_every_operator_route(
        broker: BrokerProcess, api: Api, clients: ClientPool) -> None:
    """The queue is never in the broker's memory (nothing deliverable), only in the store;
    its row is newer than the API's cached depths (read just before), and each route that
    looks a destination up finds it at once."""
    assert api.get("/api/v1/destinations")[0] == 200  # the depths cache read now
    queue = f"/queue/{unique('only-later')}"
    clients(broker.port).send(queue, "later", headers={"AMQ_SCHEDULED_DELAY": LATER})
    row = api.destination(queue)
    assert row is not None, f"{queue} unknown to GET /api/v1/destinations{queue}"
    assert (row["scheduled"], row["waiting"], row["kind"]) == (1, 0, "queue")
    assert api.ok("GET", f"/api/v1/messages{queue}")["messages"] == []  # not deliverable
    assert [r["body"] for r in listed(api, queue)] == ["later"]
    assert api.ok("POST", f"/api/v1/purge{queue}")["purged"] == 0  # scheduled rows stay
    assert api.ok("POST", f"/api/v1/move{queue}", {"to": f"{queue}.x"})["moved"] == 0
    assert [r["body"] for r in listed(api, queue)] == ["later"]
    assert api.ok("DELETE", f"/api/v1/destinations{queue}")["deleted"] == 1
    assert api.get(f"/api/v1/destinations{queue}")[0] == 404


def test_cancel_stops_a_repeating_schedule(broker: BrokerProcess, api: Api,
                                          clients: ClientPool) -> None:
    queue = f"/queue/{unique('stop')}"
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    clients(broker.port).send(queue, "again", headers={
        "AMQ_SCHEDULED_PERIOD": "150", "AMQ_SCHEDULED_REPEAT": "1000"})
    consumer.listener.wait_messages(2)
    [row] = listed(api, queue)
    assert api.ok("DELETE", f"/api/v1/scheduled/{row['id']}")["cancelled"] == 1
    at_cancel = consumer.listener.count()
    # A copy made by the round the cancel waited for may still be on its way: one more.
    assert consumer.listener.wait_quiet(QUIET, timeout=10)
    assert consumer.listener.count() <= at_cancel + 1
    assert listed(api, queue) == []


#: Messages due from 0.1 to 2 s ahead of their SEND (the first ones may be made
#: deliverable by the master before it dies, the rest by its successor), and a repeating
#: one: 1.2 s, then every 0.3 s, four copies.
TAKEOVER_DELAYS = {f"m{i}": 100 + 100 * i for i in range(20)}
REPEATING = {"AMQ_SCHEDULED_DELAY": "1200", "AMQ_SCHEDULED_PERIOD": "300",
             "AMQ_SCHEDULED_REPEAT": "3"}


def send_takeover_schedule(producer: Client, dest: str) -> float:
    """SEND TAKEOVER_DELAYS and REPEATING to ``dest`` (the last with a RECEIPT: the
    others committed before it); the wall clock just before the first."""
    before = time.time()
    for body, delay in TAKEOVER_DELAYS.items():
        producer.conn.send(dest, body, headers={"AMQ_SCHEDULED_DELAY": str(delay)})
    producer.send(dest, "rep", headers=REPEATING)
    return before


def assert_each_occurrence_once(consumer: Client, arrivals: Arrivals, before: float) -> None:
    """Every occurrence of ``send_takeover_schedule``'s messages arrived exactly once,
    none before its time (nothing more within a second after the last)."""
    expected = len(TAKEOVER_DELAYS) + 4
    got = consumer.listener.wait_messages(expected, timeout=60)
    quiet = consumer.listener.holds_for(lambda: consumer.listener.count() == expected, 1.0)
    assert quiet, collections.Counter(m.body for m in consumer.listener.snapshot())
    counts = collections.Counter(m.body for m in got)
    assert counts == {**{b: 1 for b in TAKEOVER_DELAYS}, "rep": 4}, counts
    assert len({m.headers["message-id"] for m in got}) == expected
    for at, frame in arrivals.snapshot():
        if frame.body != "rep":
            assert at >= before + TAKEOVER_DELAYS[frame.body] / 1000, (frame.body, at - before)
    reps = sorted(at - before for at, f in arrivals.snapshot() if f.body == "rep")
    assert all(at >= 1.2 + 0.3 * k for k, at in enumerate(reps)), reps  # 1.2 s, then 0.3 s


@pytest.mark.timeout(240)
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_the_new_master_delivers_each_occurrence_once_at_or_after_its_time(
        broker_factory: BrokerFactory, clients: ClientPool, request: pytest.FixtureRequest,
        store: str) -> None:
    """Two nodes on one store; messages due from 0.1 to 2 s ahead and a repeating one;
    SIGKILL the master at once. The new master delivers every occurrence exactly once,
    none before its time."""
    master, slave = start_pair(broker_factory, ("sched-a", "sched-b"),
                               store_args=store_args(store, request))
    queue = f"/queue/{unique('ha')}"
    before = send_takeover_schedule(clients(master.port), queue)
    master.kill()
    slave.wait_serving(timeout=30)
    consumer = clients(slave.port)
    arrivals = timed(consumer)
    consumer.subscribe(queue)
    assert_each_occurrence_once(consumer, arrivals, before)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_durable_subscriber_gets_each_occurrence_once_across_a_takeover(
        broker_factory: BrokerFactory, clients: ClientPool, request: pytest.FixtureRequest,
        store: str) -> None:
    """The same for a topic's durable subscription: it subscribed on the first master and
    went offline (its copies are stored for it); the master is SIGKILLed with the schedule
    in flight; the subscriber comes back to the new master as it takes over (its backlog
    is paged while the new master's first rounds commit copies for it) and gets every
    occurrence exactly once, none before its time."""
    master, slave = start_pair(broker_factory, ("sched-da", "sched-db"),
                               store_args=store_args(store, request))
    topic, client_id, name = f"/topic/{unique('ha')}", unique("cid"), unique("durable")
    durable = {"activemq.subscriptionName": name}
    offline = clients(master.port, headers={"client-id": client_id})
    offline.subscribe(topic, headers=durable)
    offline.close()
    before = send_takeover_schedule(clients(master.port), topic)
    master.kill()
    slave.wait_serving(timeout=30)
    back = clients(slave.port, headers={"client-id": client_id})
    arrivals = timed(back)
    back.subscribe(topic, headers=durable)
    assert_each_occurrence_once(back, arrivals, before)


def test_stomp_clients_see_a_non_persistent_scheduled_send_stored(
        broker: BrokerProcess, api: Api, clients: ClientPool) -> None:
    """persistent:false is scheduled through the store like ActiveMQ's scheduler store
    (documented in the README), and its copy is delivered persistent."""
    queue = f"/queue/{unique('np')}"
    clients(broker.port).send(queue, "kept", headers={"persistent": "false",
                                                      "AMQ_SCHEDULED_DELAY": "300"})
    assert [r["body"] for r in listed(api, queue)] == ["kept"]
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    [m] = consumer.listener.wait_messages(1)
    assert m.headers["persistent"] == "true"

