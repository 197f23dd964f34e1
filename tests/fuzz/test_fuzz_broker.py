"""Fuzz a real broker with hostile frames while a canary checks nothing else notices.

Issue 12: one frame from a careless or hostile client must stop nothing and lose nothing.
For a time budget per store, worker threads pipeline seeded hostile frames over raw
sockets (tests/fuzz/mutator.py, tests/fuzz/fuzzer.py) and well-behaved stomp.py clients
of every STOMP version produce and consume on destinations the fuzzer also writes to
(tests/fuzz/canary.py). A fuzz connection may get an ERROR and be closed; what fails the
test: the broker exits, demotes, logs a traceback, shows a client a traceback, leaves an
open connection unanswered, applies an ACK of a transaction that did not commit; a
receipted canary message is lost or duplicated; a canary connection gets an ERROR, a
forged frame or a disconnect; fewer cases ran than the floor.

The suite runs one fixed seed (CI_SEED), as Hypothesis' ``derandomize`` does for CI: a
test suite's verdict must not depend on the roll of a die. Exploring is a separate,
deliberate run: AMQLITE_FUZZ_SEED=random draws a fresh seed (scripts/fuzz runs many).
Every bug a fresh seed finds gets a test of its own (tests/integration/
test_edge_validation.py), not just a new seed here.

Reproduce a failure with the seed it prints: AMQLITE_FUZZ_SEED=<seed> gives every worker
the same frame stream again (thread timing still varies); narrow it down with
AMQLITE_FUZZ_KINDS=send-int,tx (see mutator.KIND_WEIGHTS) and AMQLITE_FUZZ_SECONDS. A
failure lists the frames every worker had in flight: the culprit is among them.
"""

from __future__ import annotations

import os

import pytest

from tests.fuzz.canary import Canary
from tests.fuzz.fuzzer import Fuzzer
from tests.fuzz.mutator import ALL_KINDS
from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import BrokerFactory, assert_broker_serves, unique
from tests.helpers.seeds import fuzz_seed

#: Wall-time budget of the fuzzing per store: with broker start-up and the canary's drain
#: the two stores take about 70 s of the suite's 30 minutes (45 s each took 93 s, and the
#: suite ran past 30 minutes: session 19). scripts/fuzz explores for longer.
FUZZ_SECONDS = 30.0
#: Cases that must run within FUZZ_SECONDS (scaled when AMQLITE_FUZZ_SECONDS changes it):
#: "thousands per CI run" on a loaded 2-core machine. Measured on the shared 2-core box:
#: 75,000 to 77,000 handled cases in 45 s on either store (2026-11-24, the 2-core VM), so
#: about 50,000 in 30 s; the floor leaves room for a slower broker and a much busier
#: machine.
MIN_CASES = 5000
#: The seed of the suite's run (any fixed number; this one is the day it was fixed).
CI_SEED = 20261124
#: Fuzz connections at once: enough to keep the broker busy during each one's round trips.
WORKERS = 4
#: Destinations the fuzzer uses besides the canary's (few, so SUBSCRIBE, SEND and ACK meet).
FUZZ_QUEUES = 6
FUZZ_TOPICS = 3

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def fuzz_settings() -> tuple[int, float, tuple[str, ...]]:
    seed = fuzz_seed(CI_SEED)
    seconds = float(os.environ.get("AMQLITE_FUZZ_SECONDS") or FUZZ_SECONDS)
    kinds_env = os.environ.get("AMQLITE_FUZZ_KINDS", "")
    kinds = tuple(k.strip() for k in kinds_env.split(",") if k.strip()) or ALL_KINDS
    return seed, seconds, kinds


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_hostile_frames_stop_nothing_and_lose_nothing(
        store: str, broker_factory: BrokerFactory, request: pytest.FixtureRequest) -> None:
    """Thousands of hostile frames: the broker stays master, the canary sees nothing."""
    seed, seconds, kinds = fuzz_settings()
    broker = broker_factory.start(name=f"fuzz-{store}", extra_args=store_args(store, request))
    tag = unique("fz")
    canary = Canary(broker.port, f"/queue/canary-{tag}", f"/topic/canary-{tag}")
    fuzzer = Fuzzer(broker, seed=seed, workers=WORKERS, mutator_args={
        "canary_queue": canary.queue, "canary_topic": canary.topic,
        "fuzz_queues": [f"/queue/{tag}-{i}" for i in range(FUZZ_QUEUES)],
        "fuzz_topics": [f"/topic/{tag}-{i}" for i in range(FUZZ_TOPICS)],
        "kinds": kinds,
    })
    print(f"\nfuzz[{store}]: seed={seed} (AMQLITE_FUZZ_SEED={seed} reproduces) "
          f"budget={seconds}s kinds={','.join(kinds)}")
    problems: list[str] = []
    try:
        canary.start()
        fuzzer.run(seconds)
        if fuzzer.fatal.is_set():
            canary.stop.set()  # the broker is gone: waiting for the canary proves nothing
        else:
            canary.finish()
            problems += [f"* canary: {p}" for p in canary.check()]
            try:
                assert_broker_serves(broker.port)
            except AssertionError as exc:
                problems.append(f"* a fresh client cannot use the broker any more: {exc}")
            fuzzer.check_broker()  # anything logged while the canary drained
    finally:
        canary.close()
    problems = [f.render() for f in fuzzer.findings] + problems
    stats = fuzzer.stats
    floor = int(MIN_CASES * seconds / FUZZ_SECONDS)
    summary = (f"fuzz[{store}] seed={seed}: {stats.cases} cases in {stats.batches} batches on "
               f"{stats.connections} connections, {stats.errors} ERROR frames; transaction "
               f"oracle: {stats.tx_committed} committed, {stats.tx_rejected} rejected and "
               f"undone; "
               f"kinds {dict(stats.kinds)}; {canary.summary()}")
    print(summary)
    if not fuzzer.fatal.is_set() and stats.cases < floor:
        problems.append(f"* only {stats.cases} cases ran in {seconds}s; the floor is {floor}")
    if problems:
        pytest.fail(f"{summary}\nreproduce with AMQLITE_FUZZ_SEED={seed}\n"
                    + "\n".join(problems), pytrace=False)
