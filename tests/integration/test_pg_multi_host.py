"""Issue 22: a store and a lock reached through a two-host URL whose first host is down
(a closed port on 127.0.0.1) and whose second is the test PostgreSQL. libpq tries the
hosts in order; amqlite takes both of libpq's spellings, and a second node written the
other way is the same group on the same store (it takes over when the master dies)."""

from __future__ import annotations

import pytest

from tests.helpers.broker_proc import BrokerFactory, assert_broker_serves, unique
from tests.helpers.pg_ha import PgGroup, wait_log
from tests.helpers.servers import PostgresServer, free_port

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_two_host_urls_with_the_first_host_down(broker_factory: BrokerFactory,
                                                postgres_server: PostgresServer,
                                                pg_url: str) -> None:
    db = pg_url.rsplit("/", 1)[1]
    down, up = free_port(), postgres_server.port  # nothing listens on `down`
    comma = (f"postgresql://postgres@127.0.0.1:{down},127.0.0.1:{up}/{db}"
             "?target_session_attrs=read-write")
    query = f"postgresql://postgres@/{db}?host=127.0.0.1,127.0.0.1&port={down},{up}"
    group = unique("mh")
    env = {"AMQLITE_LOCK_POLL_INTERVAL": "0.1", "AMQLITE_LOCK_KEEPALIVE": "0.5"}
    first = broker_factory.new(name="mh1", group=group, env=env,
                               extra_args=["--store", comma, "--locker", query]).start()
    first.wait_serving(60)
    wait_log(first, f"127.0.0.1:{down},127.0.0.1:{up}/{db}")  # the store, as described
    assert_broker_serves(first.port)
    ha = PgGroup(broker_factory, postgres_server, pg_url, group=group, brokers=[first])
    assert ha.lock_holders() == [f"amqlite-lock:{group}:mh1"]

    # The other spellings: query form for the store, comma form for the lock.
    second = broker_factory.new(name="mh2", group=group, env=env,
                                extra_args=["--store", query, "--locker", comma]).start()
    ha.brokers.append(second)
    wait_log(second, "waiting for the lock")
    first.kill()
    master, took = ha.wait_one_master()
    assert master is second
    print(f"\ntakeover through the two-host URLs: {took:.3f}s")
    assert_broker_serves(second.port)
