"""Issue 23, item 8, through a broker process: SUBSCRIBE/UNSUBSCRIBE pairs on ever new
queue and topic names leave nothing in memory (they left +75 MB per 100,000 pairs: a
``Source`` per queue, an empty subscriber list per topic, for ever).

One raw connection pipelines the pairs (no RECEIPT but the last, so the broker reads
as fast as it can) and the broker's RSS (``VmRSS``) after them is compared with its RSS
after a warm-up of the same traffic (the allocator's pools, the connection's buffers).
The bound, ``RSS_GROWTH``: a leak of 50 bytes a pair would be 10 MB over the 200,000
pairs; what is left of freed objects in the allocator's arenas is a few MB at most.

The behaviour (a dropped queue made again on its next use, a queue with stored messages
kept and paged back) is tested in-process: tests/broker/test_destination_memory.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    RawStomp,
    assert_broker_serves,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MIB = 1024 * 1024
#: Pairs per kind (queues, topics): 200,000 in all.
PAIRS = 100_000
WARM_UP = 5_000
#: Frames sent per write.
CHUNK = 2_000
#: RSS the pairs may add over the warm-up (see the module docstring).
RSS_GROWTH = 10 * MIB
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


def test_subscribe_unsubscribe_on_new_names_leaves_no_memory(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start()
    prefix = unique("churn")
    with RawStomp(broker.port, timeout=RECEIPT_TIMEOUT) as raw:
        raw.connect()
        pairs(raw, prefix, 0, WARM_UP, "warm")
        before = rss(broker.pid)
        pairs(raw, prefix, WARM_UP, 2 * PAIRS, "done")
        after = rss(broker.pid)
    growth = after - before
    print(f"RSS {before / MIB:.1f} MiB -> {after / MIB:.1f} MiB after {2 * PAIRS} "
          f"SUBSCRIBE/UNSUBSCRIBE pairs: {growth / MIB:+.1f} MiB")
    assert growth <= RSS_GROWTH, (
        f"RSS grew {growth / MIB:.1f} MiB over {2 * PAIRS} pairs (bound "
        f"{RSS_GROWTH / MIB:.0f} MiB)")
    assert_broker_serves(broker.port)
