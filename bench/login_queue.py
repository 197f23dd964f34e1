"""The login check queue under a flood of unique wrong passcodes for one login, in
process (issue 23): ``amqlite.auth.CheckQueue`` with one thread and a check that takes
``--check-ms`` (scrypt's ~30 ms on an idle core), a flood submitting ``--rate`` guesses
a second, each a new passcode, for alice from alice's address, and alice submitting her
right passcode again every ``--retry-ms`` until it is accepted (her cached answer is
forgotten between rounds: never verified). Prints one JSON line: per round, the seconds
to ACCEPTED and the tries, or the last outcome at ``--give-up`` s.

    .venv/bin/python bench/login_queue.py --rate 1000 --check-ms 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from amqlite.auth import Authenticator, CheckOutcome, CheckQueue, CredentialCache

#: Guesses submitted per loop turn of the flood (a burst of sockets read at once).
BURST = 10


class SlowAuth(Authenticator):
    """Stands for scrypt: sleeps ``seconds`` (off the loop, as scrypt is) and accepts
    only "right"."""

    def __init__(self, seconds: float) -> None:
        super().__init__({"alice": "not used"})
        self.seconds = seconds

    def check(self, login: str | None, passcode: str | None) -> bool:
        time.sleep(self.seconds)
        return passcode == "right"


async def run(rate: float, check_s: float, retry_s: float, rounds: int,
              give_up: float) -> list[dict[str, object]]:
    queue = CheckQueue(SlowAuth(check_s), threads=1, cache=CredentialCache())
    stopping = asyncio.Event()

    async def flood() -> None:
        n = 0
        while not stopping.is_set():
            for _ in range(BURST):
                n += 1
                queue.submit("nat", "alice", f"guess-{n}", lambda outcome: None)
            await asyncio.sleep(BURST / rate)

    task = asyncio.create_task(flood())
    await asyncio.sleep(0.5)  # the queue at its bounds before alice comes
    results: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    for _ in range(rounds):
        start, tries = time.monotonic(), 0
        outcome = CheckOutcome.BUSY
        while time.monotonic() - start < give_up:
            tries += 1
            answer: asyncio.Future[CheckOutcome] = loop.create_future()
            queue.submit("nat", "alice", "right",
                         lambda o, f=answer: None if f.done() else f.set_result(o))
            outcome = await answer
            if outcome is CheckOutcome.ACCEPTED:
                break
            await asyncio.sleep(retry_s)
        results.append({"seconds": round(time.monotonic() - start, 3), "tries": tries,
                        "outcome": outcome.value})
        assert queue.cache is not None
        queue.cache.clear()  # never verified, next round
    stopping.set()
    await task
    queue.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="guesses a second")
    parser.add_argument("--check-ms", type=float, default=30.0, help="one check's time")
    parser.add_argument("--retry-ms", type=float, default=300.0, help="alice's pause")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--give-up", type=float, default=10.0, help="seconds a round")
    a = parser.parse_args()
    results = asyncio.run(run(a.rate, a.check_ms / 1000, a.retry_ms / 1000, a.rounds,
                              a.give_up))
    print(json.dumps({"bench": "login_queue", "rate": a.rate, "check_ms": a.check_ms,
                      "retry_ms": a.retry_ms, "rounds": results}))


if __name__ == "__main__":
    main()
