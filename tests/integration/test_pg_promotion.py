"""Issue 22: the store's PostgreSQL fails over. A primary with a synchronous standby
(tests/helpers/pg_standby.py); two nodes whose store and lock URLs name both servers,
primary first, with target_session_attrs=read-write. Under load the primary is stopped
with ``-m immediate`` and the standby promoted: a node takes over on the promoted server
and every receipted message is there once and delivered once (each was on the standby
before its RECEIPT)."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.helpers.broker_proc import BrokerFactory, unique
from tests.helpers.pg_ha import (
    LOCK_KEEPALIVE,
    PgGroup,
    Producer,
    assert_delivered_once,
    drain_queue,
    wait_log,
)
from tests.helpers.pg_standby import STANDBY_NAME, replicated_postgres
from tests.helpers.servers import _as_postgres, _pg_bin

pytestmark = pytest.mark.integration

#: Receipts each producer must get before the failover and again after it.
PROGRESS = 20
#: The promoted server takes writes within seconds; a node must serve on it within this.
PROMOTION_TAKEOVER_LIMIT = 60.0


@pytest.mark.timeout(300)
def test_primary_crash_and_promotion_lose_no_receipted_message(
        broker_factory: BrokerFactory) -> None:
    with replicated_postgres() as pair:
        pair.set_synchronous(STANDBY_NAME)
        pair.wait_streaming("sync")
        db = pair.primary.create_database().rsplit("/", 1)[1]
        url = (f"postgresql://postgres@127.0.0.1:{pair.primary.port},"
               f"127.0.0.1:{pair.standby.port}/{db}?target_session_attrs=read-write")
        ha = PgGroup(broker_factory, pair.primary, pair.primary.url(db), group=unique("promo"))
        env = {"AMQLITE_LOCK_KEEPALIVE": LOCK_KEEPALIVE}
        for name in ("p1", "p2"):
            ha.brokers.append(broker_factory.new(
                name=name, group=ha.group, env=env,
                extra_args=["--store", url, "--locker", url, "--rejoin"]).start())
        ha.wait_one_master(timeout=60)
        queue = f"/queue/{unique('promo')}"
        producers = [Producer(lambda: [b.port for b in ha.brokers], queue) for _ in range(2)]
        for p in producers:
            p.start()
        for p in producers:
            p.wait_receipts(PROGRESS)
        epoch = ha.epoch()
        marks = {b.name: len(b.log_text()) for b in ha.brokers}

        crashed = time.monotonic()
        pair.primary.stop("immediate")
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(pair.standby.datadir),
                                     "-w", "promote"]), check=True, capture_output=True)
        ha.server = pair.standby  # the group's database is on the promoted server now
        master, _ = ha.wait_one_master(timeout=PROMOTION_TAKEOVER_LIMIT)
        print(f"\nserving again on the promoted standby {ha.first_seen - crashed:.2f}s "
              "after the primary's crash")
        assert ha.epoch() > epoch
        wait_log(master, "store replication at activation: no replication",
                 marks[master.name])
        for p in producers:
            p.wait_receipts(p.receipt_count() + PROGRESS, timeout=60)

        keys: set[str] = set()
        for p in producers:
            keys |= p.finish()
        master, _ = ha.wait_one_master()
        ha.assert_store_consistent(keys, master)
        frames = drain_queue(master.port, queue, len(keys))
        assert_delivered_once(frames, keys)
        print(f"{len(keys)} messages receipted, {sum(p.resent for p in producers)} re-sent "
              "after the failover")
