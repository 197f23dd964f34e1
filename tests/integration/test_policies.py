"""Policies per destination (amqlite.policy) against a real broker process, with stomp.py:
a dead-letter queue per destination, redelivery back-off, TTL, max-length with
reject-publish and drop-head, max-bytes; what the API and `queue list` show; a bad
policy at start; a delayed redelivery that survives a SIGKILL takeover."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import stomp

from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    amqlite_command,
    cli_env,
    open_client,
    send_many,
    start_pair,
    unique,
)
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: Back-off under test: 0.3 s, then 0.6 s, then capped at 1 s.
BACKOFF = (0.3, 2.0, 1.0)
#: Scheduling slack allowed below a delay: the due time is in ms, the timer's wake-up
#: and our clock read may round the other way.
EARLY = 0.05
#: The TTL a policy gives messages without one, and its cap (s).
TTL, TTL_CAP = 0.5, 2.0
#: A takeover's redelivery delay: longer than a takeover on the embedded store (~0.2 s
#: with a 0.1 s lock poll), so a redelivery that forgot its delay comes visibly early.
TAKEOVER_DELAY = 3.0

POLICIES = f"""
[[policy]]
destination = "/queue/pol.dlq.>"
dead_letter_strategy = "individual"
max_redeliveries = 1

[[policy]]
destination = "/queue/pol.backoff.>"
redelivery_delay = {BACKOFF[0]}
redelivery_multiplier = {BACKOFF[1]}
max_redelivery_delay = {BACKOFF[2]}
max_redeliveries = 10

[[policy]]
destination = "/queue/pol.ttl.>"
message_ttl = {TTL}
max_message_ttl = {TTL_CAP}

[[policy]]
destination = "/queue/pol.reject.>"
max_length = 3
overflow = "reject-publish"

[[policy]]
destination = "/queue/pol.drop.>"
max_length = 3
overflow = "drop-head"

[[policy]]
destination = "/queue/pol.bytes.>"
max_bytes = 10
overflow = "reject-publish"

[[policy]]
destination = "/topic/pol.t.>"
dead_letter_strategy = "individual"
max_redeliveries = 0
message_ttl = 60

[[policy]]
destination = "/queue/pol.later.>"
redelivery_delay = 600

[[policy]]
destination = "/queue/pol.takeover.>"
redelivery_delay = {TAKEOVER_DELAY}
"""


def config(tmp: Path, extra: str = "") -> Path:
    path = tmp / f"{unique('policies')}.toml"
    path.write_text(extra + POLICIES)
    return path


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory, tmp_path_factory: pytest.TempPathFactory
           ) -> BrokerProcess:
    conf = config(tmp_path_factory.mktemp("policies"))
    return start_with_http(module_factory, "policies", extra_args=["--config", str(conf)],
                           env={"AMQLITE_HOUSEKEEPING_INTERVAL": "0.5"})


class Stamps(stomp.ConnectionListener):
    """When each MESSAGE arrived (monotonic), by body, for redelivery timing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: list[tuple[str, float]] = []

    def on_message(self, frame: stomp.utils.Frame) -> None:
        with self.lock:
            self.times.append((frame.body, time.monotonic()))


def nack_until_gone(client: Client, queue: str, nacks: int) -> list[stomp.utils.Frame]:
    """Subscribe client-individual and NACK each delivery of the one message ``nacks``
    times; the deliveries seen."""
    client.subscribe(queue, ack="client-individual")
    for i in range(nacks):
        got = client.listener.wait_messages(i + 1)
        client.nack(got[i])
    return client.listener.snapshot()


def test_individual_dead_letter_queue_after_max_redeliveries(broker: BrokerProcess,
                                                             clients: ClientPool) -> None:
    """max_redeliveries = 1: the second NACK moves it to /queue/DLQ.<name>, not the
    shared /queue/DLQ, with original-destination."""
    queue = f"/queue/pol.dlq.{unique('orders')}"
    clients(broker.port).send(queue, "poison")
    consumer = clients(broker.port)
    seen = nack_until_gone(consumer, queue, 2)
    assert [m.body for m in seen] == ["poison", "poison"]
    assert seen[1].headers.get("redelivered") == "true"
    dead = clients(broker.port)
    dead.subscribe("/queue/DLQ." + queue.removeprefix("/queue/"))
    [msg] = dead.listener.wait_messages(1)
    assert msg.body == "poison" and msg.headers["original-destination"] == queue
    api = Api(broker.http)  # type: ignore[attr-defined]
    row = api.destination(queue)
    assert row is not None and row["dead_lettered"] == 1
    assert row["policy"]["dead_letter_queue"] == "/queue/DLQ." + queue.removeprefix("/queue/")
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 2, 0.5)


def test_a_durable_topic_subscription_dead_letters_to_its_topics_queue(
        broker: BrokerProcess, clients: ClientPool) -> None:
    """A topic's policy: max_redeliveries 0 sends the first NACKed message of a durable
    subscription to /queue/DLQ.Topic.<name>; its message_ttl stamps expires."""
    topic = f"/topic/pol.t.{unique('prices')}"
    sub = clients(broker.port, headers={"client-id": unique("cid")})
    sub.subscribe(topic, ack="client-individual",
                  headers={"activemq.subscriptionName": "dur"})
    clients(broker.port).send(topic, "tick")
    [msg] = sub.listener.wait_messages(1)
    assert int(msg.headers["expires"]) > time.time() * 1000  # the topic's message_ttl
    sub.nack(msg)
    dead = clients(broker.port)
    dead.subscribe("/queue/DLQ.Topic." + topic.removeprefix("/topic/"))
    [letter] = dead.listener.wait_messages(1)
    assert letter.body == "tick" and letter.headers["original-destination"] == topic
    assert sub.listener.holds_for(lambda: sub.listener.count() == 1, 0.5)


def test_redelivery_back_off_is_visible_in_redelivery_times(broker: BrokerProcess,
                                                            clients: ClientPool) -> None:
    """Each NACK's redelivery waits 0.3 s, 0.6 s, then the 1 s cap (0.3 x 2 ** n would
    be 1.2 s, 2.4 s, 4.8 s): lower bounds show the back-off, the last wait's upper bound
    (far below 4.8 s, room for a loaded machine) the cap."""
    queue = f"/queue/pol.backoff.{unique('q')}"
    clients(broker.port).send(queue, "again")
    consumer = clients(broker.port)
    stamps = Stamps()
    consumer.conn.set_listener("stamps", stamps)
    consumer.subscribe(queue, ack="client-individual")
    nacked: list[float] = []
    for i in range(5):
        got = consumer.listener.wait_messages(i + 1)
        nacked.append(time.monotonic())
        consumer.nack(got[i])
    consumer.listener.wait_messages(6)
    with stamps.lock:
        arrivals = [t for _, t in stamps.times]
    waits = [arrivals[i + 1] - nacked[i] for i in range(5)]
    expected = [0.3, 0.6, 1.0, 1.0, 1.0]
    for wait, want in zip(waits, expected, strict=True):
        assert wait >= want - EARLY, (waits, expected)
    assert waits[4] < 3.0, waits  # capped: uncapped it would be 4.8 s
    counts = [m.headers.get("message-id") for m in consumer.listener.snapshot()]
    assert len(set(counts)) == 1  # one message, redelivered


def test_a_non_persistent_message_waits_its_delay_too(broker: BrokerProcess,
                                                      clients: ClientPool) -> None:
    """A memory-only message is not stored: its delay is a timer of the master's."""
    queue = f"/queue/pol.backoff.{unique('np')}"
    clients(broker.port).send(queue, "light", headers={"persistent": "false"})
    consumer = clients(broker.port)
    stamps = Stamps()
    consumer.conn.set_listener("stamps", stamps)
    consumer.subscribe(queue, ack="client-individual")
    [first] = consumer.listener.wait_messages(1)
    nacked = time.monotonic()
    consumer.nack(first)
    consumer.listener.wait_messages(2)
    with stamps.lock:
        back = stamps.times[1][1]
    assert back - nacked >= BACKOFF[0] - EARLY
    assert consumer.listener.snapshot()[1].headers.get("redelivered") == "true"


def test_a_delayed_redelivery_is_scheduled_not_waiting(broker: BrokerProcess,
                                                       clients: ClientPool) -> None:
    """While it waits its delay, the API counts it scheduled (and redelivery_delayed), not
    waiting, and lists it with the scheduled messages, its plan naming the redelivery."""
    queue = f"/queue/pol.later.{unique('q')}"
    clients(broker.port).send(queue, "wait")
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual")
    consumer.nack(consumer.listener.wait_messages(1)[0])
    api = Api(broker.http)  # type: ignore[attr-defined]
    row = wait_until(lambda: (d := api.destination(queue)) and d["redelivery_delayed"] == 1
                     and d, what="a delayed redelivery counted")
    assert (row["waiting"], row["in_flight"], row["scheduled"]) == (0, 0, 1)
    [listed] = api.ok("GET", "/api/v1/scheduled?destination=" + queue)["scheduled"]
    assert listed["schedule"]["redelivery"] == 1 and listed["schedule"]["delay"] == 600_000
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1, 0.3)


def test_ttl_default_and_cap_expire_messages(broker: BrokerProcess,
                                             clients: ClientPool) -> None:
    """A message without expires gets now + message_ttl (in its expires header) and is
    gone after it; one with a far expires is capped at max_message_ttl."""
    queue = f"/queue/pol.ttl.{unique('q')}"
    producer = clients(broker.port)
    sent = time.time() * 1000
    producer.send(queue, "short-lived")
    producer.send(queue, "capped", headers={"expires": str(int(sent + 3_600_000))})
    peek = clients(broker.port)
    peek.subscribe(queue, ack="client-individual")
    short, capped = peek.listener.wait_messages(2)
    assert sent + TTL * 1000 - 5 <= int(short.headers["expires"]) <= time.time() * 1000 + TTL * 1000
    assert int(capped.headers["expires"]) <= time.time() * 1000 + TTL_CAP * 1000
    peek.close()  # unacknowledged: both go back to the queue
    expires = int(short.headers["expires"])
    wait_until(lambda: time.time() * 1000 > expires + 50, what="the TTL to pass")
    late = clients(broker.port)
    late.subscribe(queue)
    [msg] = late.listener.wait_messages(1)  # the capped one; the short one expired
    assert msg.body == "capped"
    assert late.listener.holds_for(lambda: late.listener.count() == 1, 0.5)


def test_max_length_reject_publish_refuses_the_send_with_an_error(
        broker: BrokerProcess, clients: ClientPool) -> None:
    """max_length 3, reject-publish: the 4th SEND gets an ERROR and no RECEIPT. What
    counts is what waits (RabbitMQ): messages a consumer holds unacknowledged leave room."""
    queue = f"/queue/pol.reject.{unique('q')}"
    producer = clients(broker.port)
    for i in range(3):
        producer.send(queue, f"m{i}")
    refused = clients(broker.port)
    receipt = unique("r")
    refused.conn.send(queue, "m3", headers={"receipt": receipt})
    assert refused.listener.wait_for(lambda: bool(refused.listener.errors))
    [error] = refused.listener.error_texts()
    assert f"queue {queue} is full (max_length 3)" in error and "reject-publish" in error
    assert receipt not in refused.listener.receipts
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual", headers={"activemq.prefetchSize": "3"})
    assert [m.body for m in consumer.listener.wait_messages(3)] == ["m0", "m1", "m2"]
    more = clients(broker.port)  # the three are in flight, unacknowledged: none waits
    for i in range(3, 6):
        more.send(queue, f"m{i}")  # RECEIPTs: three waiting again
    again = clients(broker.port)
    again.conn.send(queue, "m6", headers={"receipt": unique("r")})
    assert again.listener.wait_for(lambda: bool(again.listener.errors))


def test_a_commit_that_does_not_fit_is_refused_whole(broker: BrokerProcess,
                                                     clients: ClientPool) -> None:
    """Four SENDs in one transaction to a queue of max_length 3: the COMMIT gets the
    ERROR and none of them is stored."""
    queue = f"/queue/pol.reject.{unique('tx')}"
    producer = clients(broker.port)
    producer.tx("begin", "t1")
    for i in range(4):
        producer.conn.send(queue, f"t{i}", transaction="t1")
    producer.conn.commit("t1", headers={"receipt": unique("r")})
    assert producer.listener.wait_for(lambda: bool(producer.listener.errors))
    assert "is full (max_length 3)" in producer.listener.error_texts()[0]
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    clients(broker.port).send(queue, "marker")
    assert [m.body for m in consumer.listener.wait_messages(1)] == ["marker"]
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1, 0.5)


def test_max_bytes_reject_publish(broker: BrokerProcess, clients: ClientPool) -> None:
    """max_bytes 10 counts body bytes: two 5-byte bodies fit, a third does not, and a
    body larger than the limit is refused on its own."""
    queue = f"/queue/pol.bytes.{unique('q')}"
    producer = clients(broker.port)
    producer.send(queue, "12345")
    producer.send(queue, "67890")
    third = clients(broker.port)
    third.conn.send(queue, "x", headers={"receipt": unique("r")})
    assert third.listener.wait_for(lambda: bool(third.listener.errors))
    assert "max_bytes 10" in third.listener.error_texts()[0]
    big = clients(broker.port)
    big.conn.send(f"/queue/pol.bytes.{unique('empty')}", "x" * 11,
                  headers={"receipt": unique("r")})
    assert big.listener.wait_for(lambda: bool(big.listener.errors))
    assert "larger than max_bytes 10" in big.listener.error_texts()[0]


def test_max_length_drop_head_keeps_the_newest(broker: BrokerProcess,
                                               clients: ClientPool) -> None:
    """max_length 3, drop-head: five SENDs all get RECEIPTs; the two oldest are dropped
    and the API counts them."""
    queue = f"/queue/pol.drop.{unique('q')}"
    producer = clients(broker.port)
    for i in range(5):
        producer.send(queue, f"m{i}")
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    got = consumer.listener.wait_messages(3)
    assert [m.body for m in got] == ["m2", "m3", "m4"]
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 3, 0.5)
    row = Api(broker.http).destination(queue)  # type: ignore[attr-defined]
    assert row is not None and row["overflow_dropped"] == 2


def test_drop_head_with_pipelined_sends(broker: BrokerProcess, clients: ClientPool) -> None:
    """Ten SENDs pipelined (most still committing when the next arrives): every one gets
    its RECEIPT and exactly the newest three remain, none of the dropped ones is
    delivered."""
    queue = f"/queue/pol.drop.{unique('burst')}"
    send_many(clients(broker.port), queue, [f"b{i}" for i in range(10)])
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    got = consumer.listener.wait_messages(3)
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 3, 0.5)
    assert [m.body for m in got] == ["b7", "b8", "b9"]


def test_api_and_queue_list_show_the_policy(broker: BrokerProcess,
                                            clients: ClientPool) -> None:
    """The API rows carry the resolved policy; `amqlite queue list` has a policy column."""
    queue = f"/queue/pol.reject.{unique('shown')}"
    clients(broker.port).send(queue, "x")
    api = Api(broker.http)  # type: ignore[attr-defined]
    status, data = api.get("/api/v1/destinations")
    assert status == 200
    row = next(d for d in data["destinations"] if d["name"] == queue)
    policy = row["policy"]
    assert policy["pattern"] == "/queue/pol.reject.>"
    assert policy["max_length"] == 3 and policy["overflow"] == "reject-publish"
    assert policy["max_redeliveries"] == 6  # the broker-wide default fills the rest
    single = api.destination(queue)
    assert single is not None and single["policy"] == policy
    out = subprocess.run([*amqlite_command(), "queue", "list", "--url", broker.http],  # type: ignore[attr-defined]
                         capture_output=True, text=True, env=cli_env(), timeout=30)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if queue in x)
    assert "/queue/pol.reject.>: " in line and "max-length=3 reject-publish" in line
    js = subprocess.run([*amqlite_command(), "queue", "list", "--url", broker.http,  # type: ignore[attr-defined]
                         "--json"], capture_output=True, text=True, env=cli_env(), timeout=30)
    rows = {d["name"]: d for d in json.loads(js.stdout)}
    assert rows[queue]["policy"]["max_length"] == 3


def test_a_bad_policy_stops_the_start_with_one_line(broker_factory: BrokerFactory,
                                                    tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[policy]]\ndestination = "/queue/a.>"\noverflow = "reject"\n')
    b = broker_factory.start(name="bad-policy", wait=False,
                             extra_args=["--config", str(bad)])
    assert b.wait_exit(30) == 2
    tail = b.log_text().strip().splitlines()
    assert any("[[policy]] #1: overflow must be 'drop-head' or 'reject-publish', got 'reject'"
               in line for line in tail), tail[-5:]
    assert "Traceback" not in b.log_text()


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_delayed_redelivery_survives_a_sigkill_takeover(broker_factory: BrokerFactory,
                                                        tmp_path: Path, store: str,
                                                        request: pytest.FixtureRequest) -> None:
    """A NACK under a 3 s redelivery delay, then SIGKILL of the master: the new master
    redelivers the message (the delay is a stored due time), not before the delay. A
    full reject-publish queue is still full on the new master (its count is read from
    the store at activation)."""
    conf = config(tmp_path)
    master, slave = start_pair(broker_factory, env={}, store_args=store_args(store, request),
                               extra_args=["--config", str(conf)])
    queue = f"/queue/pol.takeover.{unique('q')}"
    full = f"/queue/pol.reject.{unique('full')}"
    producer = open_client(master.port)
    for i in range(3):
        producer.send(full, f"f{i}")
    producer.send(queue, "delayed")
    consumer = open_client(master.port)
    consumer.subscribe(queue, ack="client-individual")
    [msg] = consumer.listener.wait_messages(1)
    consumer.nack(msg)
    nacked = time.monotonic()
    master.kill()
    slave.wait_serving()
    producer.close()
    consumer.close()
    again = open_client(slave.port)
    try:
        again.subscribe(queue, ack="client-individual")
        [back] = again.listener.wait_messages(1, timeout=TAKEOVER_DELAY + 15)
        waited = time.monotonic() - nacked
        assert back.body == "delayed" and back.headers.get("redelivered") == "true"
        assert back.headers.get("message-id") == msg.headers["message-id"]
        assert waited >= TAKEOVER_DELAY - EARLY, waited
        assert again.listener.holds_for(lambda: again.listener.count() == 1, 0.5)
        refused = open_client(slave.port)
        refused.conn.send(full, "f3", headers={"receipt": unique("r")})
        assert refused.listener.wait_for(lambda: bool(refused.listener.errors))
        assert "is full (max_length 3)" in refused.listener.error_texts()[0]
        refused.close()
    finally:
        again.close()
