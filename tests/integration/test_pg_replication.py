"""Issue 22: a group on a replicated PostgreSQL (a primary with a streaming standby made by
``pg_basebackup -R``, tests/helpers/pg_standby.py). The master reads the replication at
start and at every activation and says it (log, /readyz, /api/v1/group, cluster-list);
asynchronous replication is refused (exit 2) unless allow_async_replication accepts it;
a commit waiting for a synchronous standby that went away is reported as exactly that,
and the master keeps its lock (no epochs cycling) until the standby is back, when the
commit and its RECEIPT go through."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    assert_broker_serves,
    open_client,
    unique,
)
from tests.helpers.cluster import amqlite, ok
from tests.helpers.mgmt import Api
from tests.helpers.pg_ha import PgGroup, new_since, wait_log
from tests.helpers.pg_standby import STANDBY_NAME, ReplicatedPostgres, replicated_postgres
from tests.helpers.poll import poll
from tests.helpers.servers import free_port

pytestmark = pytest.mark.integration

#: The group must keep its master and epoch this long while a commit waits (issue 22).
NO_CYCLE_WINDOW = 10.0
#: amqlite.replication.SLOW_COMMIT (3 s) plus a poll and a diagnosis on a loaded machine.
DIAGNOSIS_WAIT = 15.0


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedPostgres]:
    """One primary + standby for the module; each test sets the replication it needs."""
    with replicated_postgres() as p:
        yield p


def database(pair: ReplicatedPostgres) -> str:
    """A fresh database on the primary (the standby must be up when it is synchronous)."""
    return pair.primary.create_database().rsplit("/", 1)[1]


def node(ha: PgGroup, name: str, store: str, locker: str, **env: str) -> BrokerProcess:
    http = free_port()
    broker = ha.factory.new(name=name, group=ha.group, env={
        "AMQLITE_LOCK_KEEPALIVE": "0.5", "AMQLITE_LOCK_POLL_INTERVAL": "0.1", **env},
        extra_args=["--store", store, "--locker", locker, "--rejoin",
                    "--http-bind", f"127.0.0.1:{http}"])
    broker.http = f"http://127.0.0.1:{http}"  # type: ignore[attr-defined]
    ha.brokers.append(broker)
    return broker


def api(broker: BrokerProcess) -> Api:
    return Api(broker.http)  # type: ignore[attr-defined]


def send_receipted(port: int, queue: str, body: str, timeout: float) -> bool:
    """SEND with a receipt; True if the RECEIPT came within ``timeout``."""
    client = open_client(port)
    try:
        client.conn.send(queue, body, headers={"receipt": body, "persistent": "true"})
        listener = client.listener
        return listener.wait_for(lambda: body in listener.receipts, timeout)
    finally:
        client.close()


@pytest.mark.timeout(180)
def test_a_synchronous_standby_is_named_at_start_and_activation(
        broker_factory: BrokerFactory, pair: ReplicatedPostgres) -> None:
    """Both URLs list the standby first: target_session_attrs (given, or read-write by
    default) takes the primary. The master names its synchronous standby in the log,
    /readyz, /api/v1/group and cluster-list; a node activated after a takeover too."""
    pair.set_synchronous(STANDBY_NAME)
    pair.wait_streaming("sync")
    db = database(pair)
    standby, primary = pair.standby.port, pair.primary.port
    comma = (f"postgresql://postgres@127.0.0.1:{standby},127.0.0.1:{primary}/{db}"
             "?target_session_attrs=read-write")
    query = f"postgresql://postgres@/{db}?host=127.0.0.1,127.0.0.1&port={standby},{primary}"
    ha = PgGroup(broker_factory, pair.primary, pair.primary.url(db), group=unique("sync"))
    first = node(ha, "s1", comma, query).start()
    first.wait_serving(60)
    wait_log(first, f"store replication at activation: synchronous standby {STANDBY_NAME} "
                    "connected")
    assert f"store replication at start: synchronous standby {STANDBY_NAME}" \
        in first.log_text()
    assert send_receipted(first.port, f"/queue/{unique('sync')}", "first", 15)

    status, ready = api(first).get("/readyz")
    assert status == 200 and ready["ready"], ready
    rep = ready["replication"]
    assert rep["synchronous"] == [STANDBY_NAME] and rep["unsafe"] is None, rep
    assert rep["synchronous_standby_names"] == STANDBY_NAME
    assert rep["synchronous_commit"] == "on" and not ready.get("warnings"), ready
    status, group = api(first).get("/api/v1/group")
    assert status == 200 and group["replication"]["synchronous"] == [STANDBY_NAME], group

    table = ok(amqlite("cluster-list", "--store", comma)).splitlines()
    note = next((ln for ln in table if ln.startswith("[replication]")), "")
    assert note.startswith(f"[replication] {ha.group} (master s1): synchronous standby "
                           f"{STANDBY_NAME} connected"), table

    second = node(ha, "s2", query, comma).start()
    wait_log(second, "waiting for the lock")
    wait_log(second, f"store replication at start: synchronous standby {STANDBY_NAME}")
    mark = len(second.log_text())
    first.kill()
    master, _ = ha.wait_one_master(brokers=[second])
    assert master is second
    wait_log(second, f"store replication at activation: synchronous standby {STANDBY_NAME}",
             mark)
    assert_broker_serves(second.port)


@pytest.mark.timeout(240)
def test_a_commit_waiting_for_a_missing_standby_is_reported_and_keeps_the_lock(
        broker_factory: BrokerFactory, pair: ReplicatedPostgres) -> None:
    """Stop the synchronous standby: the next commit waits (no RECEIPT), the master logs
    that it waits for a synchronous standby (names, none connected) and keeps its lock:
    no other node takes over and the epoch stays for NO_CYCLE_WINDOW. The standby back,
    the commit and its RECEIPT go through at the same epoch."""
    pair.start_standby()
    pair.set_synchronous(STANDBY_NAME)
    pair.wait_streaming("sync")
    db = database(pair)
    url = pair.primary.url(db)
    ha = PgGroup(broker_factory, pair.primary, url, group=unique("wait"))
    nodes = [node(ha, f"w{i}", url, url) for i in (1, 2)]
    for b in nodes:
        b.start()
    master, _ = ha.wait_one_master(timeout=60)
    slave = next(b for b in nodes if b is not master)
    wait_log(slave, "waiting for the lock")
    queue = f"/queue/{unique('wait')}"
    assert send_receipted(master.port, queue, "before", 15)
    epoch = ha.epoch()
    marks = {b.name: len(b.log_text()) for b in nodes}

    pair.stop_standby()
    stopped = time.monotonic()
    client = open_client(master.port)
    try:
        client.conn.send(queue, "held", headers={"receipt": "held", "persistent": "true"})
        master.wait_log(r"a group commit has waited [0-9.]+s for a synchronous standby: "
                        r"\d+ store session\(s\) wait on SyncRep, synchronous_standby_names = "
                        f"'{STANDBY_NAME}', connected standbys: none", DIAGNOSIS_WAIT,
                        since=marks[master.name])
        status, ready = api(master).get("/readyz")
        assert status == 200, ready
        assert "waited" in (ready["replication"]["commit_waiting"] or ""), ready
        assert any("synchronous standby" in w for w in ready.get("warnings", [])), ready

        end = stopped + NO_CYCLE_WINDOW
        while time.monotonic() < end:
            assert ha.serving() == [master], "the group changed masters while a commit waited"
            assert ha.epoch() == epoch, "the group went through an epoch while a commit waited"
            assert "held" not in client.listener.receipts, "RECEIPT before the standby confirmed"
            time.sleep(0.2)
        for b in nodes:
            log = new_since(b, marks[b.name])
            assert "giving the lock up" not in log and "DEMOTED" not in log, b.log_tail(30)

        pair.start_standby()
        listener = client.listener
        assert listener.wait_for(lambda: "held" in listener.receipts, 30), \
            "no RECEIPT once the standby was back"
    finally:
        client.close()
    wait_log(master, "the group commit went through", marks[master.name])
    assert ha.epoch() == epoch and ha.serving() == [master]
    assert send_receipted(master.port, queue, "after", 15)


@pytest.mark.timeout(180)
def test_asynchronous_replication_is_refused_unless_accepted(
        broker_factory: BrokerFactory, pair: ReplicatedPostgres) -> None:
    """A streaming standby that is not synchronous: the node exits 2 with one line naming
    the standby and the setting; with allow_async_replication it serves and /readyz says
    what was accepted."""
    pair.start_standby()
    pair.set_synchronous("")
    pair.wait_streaming("async")
    db = database(pair)
    url = pair.primary.url(db)
    ha = PgGroup(broker_factory, pair.primary, url, group=unique("async"))
    refused = node(ha, "a1", url, url).start()
    code = refused.wait_exit(60)
    errors = [ln for ln in refused.log_text().splitlines() if ln.startswith("amqlite: error:")]
    assert code == 2, refused.log_tail(20)
    assert len(errors) == 1 and "asynchronous replication: 1 standby connected " \
        f"({STANDBY_NAME})" in errors[0] and "allow_async_replication" in errors[0], errors
    assert not refused.is_serving()

    accepted = node(ha, "a2", url, url, AMQLITE_ALLOW_ASYNC_REPLICATION="true").start()
    accepted.wait_serving(60)
    wait_log(accepted, "serving anyway (allow_async_replication)")
    _, ready = poll(lambda: api(accepted).get("/readyz"), lambda r: r[0] == 200,
                    timeout=15, what="/readyz 200")[0]
    rep = ready["replication"]
    assert rep["accepted"] and "asynchronous replication" in rep["unsafe"], rep
    assert any("accepted by allow_async_replication" in w for w in ready["warnings"]), ready
    assert_broker_serves(accepted.port)


@pytest.mark.timeout(60)
def test_a_role_without_pg_read_all_stats_infers_the_synchronous_standby(
        pair: ReplicatedPostgres) -> None:
    """pg_stat_replication hides sync_state from an ordinary role: the standby commits wait
    for is inferred from synchronous_standby_names and the names, and the summary says so."""
    from sqlalchemy import create_engine

    from store.replication import read_replication

    pair.start_standby()
    pair.set_synchronous(STANDBY_NAME)
    pair.wait_streaming("sync")
    role = unique("plain").replace("-", "_")
    pair.primary.psql(f"CREATE ROLE {role} LOGIN")
    engine = create_engine(f"postgresql+psycopg://{role}@127.0.0.1:{pair.primary.port}/postgres")
    try:
        state = read_replication(engine, "test")
    finally:
        engine.dispose()
    assert state.hidden and state.synchronous == [STANDBY_NAME], state
    assert state.unsafe is None and state.waiting is None
    assert "inferred from the names" in state.summary
