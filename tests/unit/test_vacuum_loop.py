"""``amqlite.vacuum``: the pass runs off the loop, a failure is logged and tried again."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from amqlite import vacuum
from store import StoreError

#: Upper bound for the test's one wait; it ends as soon as done.
DEADLINE_S = 10.0


class Passes:
    """A store's vacuum_messages that fails once, then records the threads it ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.second = threading.Event()

    def vacuum_messages(self) -> None:
        self.threads.append(threading.current_thread().name)
        if len(self.threads) == 1:
            raise StoreError("store: connection lost")
        self.second.set()


def test_a_failed_pass_is_logged_and_the_next_one_runs_off_the_loop(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(vacuum, "VACUUM_INTERVAL", 0.01)
    passes = Passes()

    async def scenario() -> None:
        task = asyncio.ensure_future(vacuum.every_interval(passes))  # type: ignore[arg-type]
        await asyncio.wait_for(asyncio.to_thread(passes.second.wait), DEADLINE_S)
        task.cancel()

    with caplog.at_level(logging.WARNING, logger="amqlite.vacuum"):
        asyncio.run(scenario())
    assert passes.threads[:2] == ["amqlite-vacuum", "amqlite-vacuum"]
    assert "vacuum of the message table: store: connection lost" in caplog.text
