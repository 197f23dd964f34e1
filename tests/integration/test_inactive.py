"""Issue 21, idle queues: with ``gc_inactive_destinations``, a queue that had no consumer,
message or SEND for that long is deleted (from the listing and the store) as an
operator's delete would, against a real broker process with stomp.py; a busy one stays
(a message waiting or scheduled, a consumer), and a deleted one comes back with its
next use.
"""

from __future__ import annotations

import pytest

from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, ClientPool, unique
from tests.helpers.mgmt import start_with_http, wait_until
from tests.integration.test_temporary import listed, store_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: The idle time after which the broker deletes a queue (s): small, so the test is
#: quick, and four looks (a quarter of it each) long.
GC_SECONDS = 1.0


@pytest.fixture(scope="module")
def collecting(module_factory: BrokerFactory) -> BrokerProcess:
    return start_with_http(module_factory, "gc-idle", extra_args=[
        "--gc-inactive-destinations", str(GC_SECONDS)])


def stored_names(broker: BrokerProcess) -> set[str]:
    return {r[0] for r in store_rows(broker, "SELECT name FROM amq_destinations")}


def test_idle_queues_are_deleted_and_busy_ones_kept(collecting: BrokerProcess,
                                                    clients: ClientPool) -> None:
    idle, waiting, consumed, later = (f"/queue/{unique(n)}"
                                      for n in ("idle", "waiting", "used", "later"))
    client = clients(collecting.port)
    # Used first, so it is due before the idle one: the look that deletes that one has
    # asked the store about this one, which holds a scheduled message only (its
    # subscriber, gone, left it in the broker's memory as a recovered queue would be).
    client.subscribe(later)
    client.unsubscribe(client.subscriptions[-1])
    client.send(later, "in a minute", headers={"AMQ_SCHEDULED_DELAY": "60000"})
    client.subscribe(idle, ack="client-individual")
    client.send(idle, "one")
    client.ack(client.listener.wait_messages(1)[0])
    client.unsubscribe(client.subscriptions[-1])
    client.send(waiting, "stays")  # stored, nobody consumes it
    keeper = clients(collecting.port)
    keeper.subscribe(consumed)
    assert {idle, waiting, consumed} <= listed(collecting)
    assert idle in stored_names(collecting)
    wait_until(lambda: idle not in listed(collecting), timeout=10 * GC_SECONDS + 10,
               what=f"{idle} deleted")
    assert idle not in stored_names(collecting)
    # Idle as long, but not empty: a message waits, a consumer is there, a scheduled
    # message is stored (which paging does not see).
    assert {waiting, consumed, later} <= listed(collecting)
    assert later in stored_names(collecting)
    # Deleted is not refused: the next use creates it again, with what it is sent.
    client.send(idle, "again")
    client.subscribe(idle)
    assert client.listener.wait_messages(2)[1].body == "again"
