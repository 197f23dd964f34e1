"""Issue 23, item 8, through a broker process: SUBSCRIBE/UNSUBSCRIBE pairs on ever new
queue and topic names leave nothing in memory (they left +75 MB per 100,000 pairs: a
``Source`` per queue, an empty subscriber list per topic, for ever).

One raw connection pipelines the pairs (no RECEIPT but the last, so the broker reads
as fast as it can) and the broker's RSS (``VmRSS``) after them is compared with its RSS
after a warm-up of the same traffic (the allocator's pools, the connection's buffers).
The bound, ``PAIRS_RSS_GROWTH``: a leak of 25 bytes a pair would be 5 MB over the
200,000 pairs; what is left of freed objects in the allocator's arenas is about 1 MB
(measured -0.2 to +1.0 MiB). The policy resolver's cache of names, filling and starting
over, took +7-8 MiB here (+4-5 with a users file) before it stopped caching names when
no ``[[policy]]`` entry exists.
With a users file the same holds for the destinations the broker remembers for
authorization (``known_destinations``); the policy's bounded decision cache is filled
by the warm-up.

The behaviour (a dropped queue made again on its next use, a queue with stored messages
kept and paged back) is tested in-process: tests/broker/test_destination_memory.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amqlite.authz import DECISION_CACHE_SIZE
from tests.helpers.broker_proc import (
    BrokerFactory,
    RawStomp,
    assert_broker_serves,
    password_hash,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MIB = 1024 * 1024
#: Pairs per kind (queues, topics): 200,000 in all.
PAIRS = 100_000
WARM_UP = 5_000
#: Frames sent per write.
CHUNK = 2_000
#: RSS the drained queues may add beyond what is kept of each (ROW_BYTES).
RSS_GROWTH = 10 * MIB
#: RSS the pairs may add over the warm-up (see the module docstring).
PAIRS_RSS_GROWTH = 5 * MIB
#: The pipelined frames take a while on a loaded 2-core machine.
RECEIPT_TIMEOUT = 180.0


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def pairs(raw: RawStomp, prefix: str, start: int, count: int, receipt: str) -> None:
    """``count`` SUBSCRIBE/UNSUBSCRIBE pairs on distinct names, then a RECEIPT."""
    for at in range(start, start + count, CHUNK):
        frames = []
        for i in range(at, min(at + CHUNK, start + count)):
            kind = "queue" if i % 2 else "topic"
            frames.append(f"SUBSCRIBE\ndestination:/{kind}/{prefix}.{i}\nid:s{i}\n\n\x00"
                          f"UNSUBSCRIBE\nid:s{i}\n\n\x00")
        assert raw.send_raw("".join(frames).encode()), "the broker closed the connection"
    raw.send_frame("SUBSCRIBE", {"destination": f"/queue/{prefix}.end", "id": receipt,
                                 "receipt": receipt})
    frame = raw.expect("RECEIPT", f"{count} pairs", timeout=RECEIPT_TIMEOUT)
    assert frame.headers.get("receipt-id") == receipt
    raw.send_frame("UNSUBSCRIBE", {"id": receipt})


#: With ``[[authorization]]`` entries the broker also remembers the destinations used
#: (``Broker.known_destinations``): those freed are forgotten too.
RULES = """
[groups]
churners = ["churner"]

[[authorization]]
destination = "/queue/>"
read = ["churners"]
admin = ["churners"]

[[authorization]]
destination = "/topic/>"
read = ["churners"]
admin = ["churners"]
"""


@pytest.mark.parametrize("authz", [False, True], ids=["open", "authz"])
def test_subscribe_unsubscribe_on_new_names_leaves_no_memory(
        broker_factory: BrokerFactory, tmp_path: Path, authz: bool) -> None:
    env = {}
    login = {}
    if authz:
        users = tmp_path / "users.toml"
        users.write_text(f'[users]\nchurner = "{password_hash("pw")}"\n{RULES}')
        env = {"AMQLITE_USERS_FILE": str(users)}
        login = {"login": "churner", "passcode": "pw"}
    broker = broker_factory.start(env=env)
    prefix = unique("churn")
    # The policy's decision cache is bounded (DECISION_CACHE_SIZE, about 10 MB full): the
    # warm-up fills it, so what is measured is what the pairs leave beyond it.
    warm_up = DECISION_CACHE_SIZE if authz else WARM_UP
    with RawStomp(broker.port, timeout=RECEIPT_TIMEOUT) as raw:
        raw.connect(extra=login)
        pairs(raw, prefix, 0, warm_up, "warm")
        before = rss(broker.pid)
        pairs(raw, prefix, warm_up, 2 * PAIRS, "done")
        after = rss(broker.pid)
    growth = after - before
    print(f"RSS {before / MIB:.1f} MiB -> {after / MIB:.1f} MiB after {2 * PAIRS} "
          f"SUBSCRIBE/UNSUBSCRIBE pairs: {growth / MIB:+.1f} MiB")
    assert growth <= PAIRS_RSS_GROWTH, (
        f"RSS grew {growth / MIB:.1f} MiB over {2 * PAIRS} pairs (bound "
        f"{PAIRS_RSS_GROWTH / MIB:.0f} MiB)")
    if not authz:
        assert_broker_serves(broker.port)


#: Queues that are SENT a persistent message each (so each has a store row) and drained.
DRAINED = 20_000
DRAINED_WARM_UP = 2_000
#: A drained queue out of memory still has its store row (gc_inactive_destinations
#: decides when that goes) and the broker keeps the row's id by name
#: (``Broker.destination_rows``: a dict entry, the name and the id, ~150 bytes) and its
#: totals, which mirror the row's counters in the store (``Counters``: two dict
#: entries, ~150 bytes); a queue kept in memory cost ~1.5 KB more (a ``Source``, its
#: heap, sets and counters).
ROW_BYTES = 512


def sent_and_drained(raw: RawStomp, prefix: str, start: int, count: int) -> None:
    """``count`` queues: a persistent SEND to each (its row), then a SUBSCRIBE that takes
    the message (auto ack) and an UNSUBSCRIBE; every MESSAGE read."""
    for at in range(start, start + count, CHUNK):
        names = [f"/queue/{prefix}.{i}" for i in range(at, min(at + CHUNK, start + count))]
        assert raw.send_raw("".join(f"SEND\ndestination:{n}\npersistent:true\n\nm\x00"
                                    for n in names).encode())
        raw.send_frame("SEND", {"destination": f"/queue/{prefix}.sent", "receipt": "sent"})
        raw.expect("RECEIPT", "the SENDs", timeout=RECEIPT_TIMEOUT)
        assert raw.send_raw("".join(f"SUBSCRIBE\ndestination:{n}\nid:{n}\n\n\x00"
                                    f"UNSUBSCRIBE\nid:{n}\n\n\x00" for n in names).encode())
        raw.send_frame("SUBSCRIBE", {"destination": f"/queue/{prefix}.none", "id": "last",
                                     "receipt": "drained"})
        got = 0
        while True:
            frame = raw.read_frame(RECEIPT_TIMEOUT)
            assert frame is not None, f"{got} of {len(names)} messages, then nothing"
            if frame.command == "RECEIPT":
                break
            assert frame.command == "MESSAGE", frame
            got += 1
        assert got == len(names), f"{got} of {len(names)} queues drained"
        raw.send_frame("UNSUBSCRIBE", {"id": "last"})


def test_queues_sent_to_and_drained_leave_memory(broker_factory: BrokerFactory) -> None:
    """DRAINED queues, each SENT a persistent message and drained by a consumer that then
    leaves: the broker's RSS grows by no more than RSS_GROWTH plus what it keeps of each
    row (before, each stayed in memory until gc_inactive_destinations deleted it)."""
    # Without the management API: its rate sampler reads every stored destination's
    # depth every 2 s and lists them all (~1 KB per stored queue, drained or not), which
    # is the listing's cost, not the broker's.
    broker = broker_factory.start(extra_args=["--http", "off"])
    prefix = unique("drained")
    with RawStomp(broker.port, timeout=RECEIPT_TIMEOUT) as raw:
        raw.connect()
        sent_and_drained(raw, prefix, 0, DRAINED_WARM_UP)
        before = rss(broker.pid)
        sent_and_drained(raw, prefix, DRAINED_WARM_UP, DRAINED)
        after = rss(broker.pid)
    growth = after - before
    bound = RSS_GROWTH + DRAINED * ROW_BYTES
    print(f"RSS {before / MIB:.1f} MiB -> {after / MIB:.1f} MiB after {DRAINED} queues "
          f"sent to and drained: {growth / MIB:+.1f} MiB (bound {bound / MIB:.1f} MiB)")
    assert growth <= bound, (
        f"RSS grew {growth / MIB:.1f} MiB over {DRAINED} drained queues (bound "
        f"{bound / MIB:.1f} MiB)")
    assert_broker_serves(broker.port)
