"""Throughput of the store's hot path: persistent sends and acks through the
GroupCommitter, with N concurrent submitters each waiting for its commit (like
producers waiting for a RECEIPT), on SQLite and on PostgreSQL.

    .venv/bin/python bench/store_bench.py [--pg-url URL] [--messages N] [--concurrency N]

Without --pg-url (or AMQLITE_BENCH_PG_URL) a throwaway PostgreSQL is started
with tests/helpers/servers.py. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store import Batch, DestinationRow, GroupCommitter, NewMessage, Store, open_store

#: Defaults: enough messages for a few seconds per phase on a small machine.
DEFAULT_MESSAGES = 20_000
DEFAULT_CONCURRENCY = 64
DEFAULT_BODY_SIZE = 1024  # "1 KB bodies"
QUEUE = DestinationRow(1, "/queue/bench", "queue")


async def _phase(
    committer: GroupCommitter, batches: list[list[Batch]]
) -> tuple[float, int]:
    """Each worker submits its batches one at a time, awaiting each commit."""
    commits_before = committer.commits

    async def worker(mine: list[Batch]) -> None:
        for b in mine:
            await committer.submit(b)

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in batches))
    return time.perf_counter() - start, committer.commits - commits_before


async def bench_store(store: Store, messages: int, concurrency: int, body_size: int) -> dict:
    epoch = store.claim_epoch("bench")
    store.commit_batch(epoch, Batch(destinations=[QUEUE]))
    ids = itertools.count(store.recover(epoch).next_message_id)
    body = os.urandom(body_size)
    headers = {"persistent": "true", "content-type": "application/octet-stream"}
    per_worker: list[list[int]] = [[] for _ in range(concurrency)]
    for i in range(messages):
        per_worker[i % concurrency].append(next(ids))
    sends = [
        [Batch(inserts=[NewMessage(
            id=mid, destination_id=QUEUE.id, message_id=f"ID:bench-{mid}", headers=headers,
            body=body, enqueued_at=int(time.time() * 1000), producer_id=f"p{w}",
            producer_seq=mid, dedup_key=f"p{w}:{mid}")]) for mid in mids]
        for w, mids in enumerate(per_worker)
    ]
    acks = [[Batch(acks=[(None, mid)]) for mid in mids] for mids in per_worker]
    failures: list[BaseException] = []
    committer = GroupCommitter(store, epoch, asyncio.get_running_loop(), failures.append)
    try:
        send_s, send_commits = await _phase(committer, sends)
        ack_s, ack_commits = await _phase(committer, acks)
    finally:
        committer.close()
        await committer.wait_closed()
    if failures:
        raise failures[0]
    return {
        "inserts_per_s": round(messages / send_s),
        "acks_per_s": round(messages / ack_s),
        "insert_commits": send_commits,
        "ack_commits": ack_commits,
        "avg_inserts_per_commit": round(messages / max(send_commits, 1), 1),
        "avg_acks_per_commit": round(messages / max(ack_commits, 1), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg-url", default=os.environ.get("AMQLITE_BENCH_PG_URL"))
    ap.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    ap.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    ap.add_argument("--body-size", type=int, default=DEFAULT_BODY_SIZE)
    ap.add_argument("--backends", default="sqlite,postgresql")
    args = ap.parse_args()
    out: dict[str, Any] = {"messages": args.messages, "concurrency": args.concurrency,
                           "body_size": args.body_size}
    group = f"bench-{os.getpid()}-{int(time.time())}"
    server = None
    try:
        for backend in args.backends.split(","):
            if backend == "sqlite":
                tmp = tempfile.mkdtemp(prefix="amqlite-bench-")
                url = f"sqlite:///{tmp}/amqlite.db"
            else:
                url = args.pg_url
                if not url:
                    from tests.helpers.servers import PostgresServer

                    server = PostgresServer()
                    server.init()
                    server.start()
                    url = server.create_database()
            store = open_store(url, group)
            store.open()
            try:
                out[backend] = asyncio.run(
                    bench_store(store, args.messages, args.concurrency, args.body_size))
            finally:
                store.close()
    finally:
        if server is not None:
            server.cleanup()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
