"""A lock holder in its own process: acquire, say so, keep the lock alive until killed.

Usage: python -m tests.lockers.holder URL GROUP [SESSION_TIMEOUT]
"""

from __future__ import annotations

import asyncio
import sys

from lockers import LockLost, open_locker

#: How often the holder proves its lock; short so a test sees it alive.
HOLDER_KEEPALIVE = 0.2


async def main(url: str, group: str, session_timeout: float | None) -> int:
    locker = open_locker(url, group, session_timeout=session_timeout, node="holder")
    await locker.acquire()
    print("ACQUIRED", flush=True)
    try:
        while True:
            await locker.keepalive()
            await asyncio.sleep(HOLDER_KEEPALIVE)
    except LockLost:
        print("LOST", flush=True)
        return 3
    finally:
        await locker.close()


if __name__ == "__main__":
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else None
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], timeout)))
