"""The mutator alone (no broker): a seed reproduces the same frames, and every kind of
case can be generated on its own (AMQLITE_FUZZ_KINDS narrows a failing run down)."""

from __future__ import annotations

import pytest

from amqlite.codec import Frame, FrameParser, ProtocolError
from amqlite.wire import STOMP_1_0, STOMP_1_1, STOMP_1_2
from tests.fuzz.mutator import ALL_KINDS, ConnState, Mutator

DESTINATIONS = {"canary_queue": "/queue/canary", "canary_topic": "/topic/canary",
                "fuzz_queues": ["/queue/fz-0", "/queue/fz-1"], "fuzz_topics": ["/topic/fz-0"]}


def frames(seed: int, kinds: tuple[str, ...] = ALL_KINDS, batches: int = 200) -> list[bytes]:
    mutator = Mutator(seed, kinds=kinds, **DESTINATIONS)  # type: ignore[arg-type]
    state = ConnState()
    out = []
    for _ in range(batches):
        cases = mutator.batch(state, 8)
        assert all(not c.terminal for c in cases[:-1]), "a terminal case must end its batch"
        out.append(mutator.join(cases))
    return out


def test_a_seed_reproduces_the_same_frames() -> None:
    assert frames(42) == frames(42)
    assert frames(42) != frames(43)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_each_kind_generates_frames_on_its_own(kind: str) -> None:
    generated = frames(7, (kind,), batches=20)
    assert all(generated)


def test_canary_queue_is_never_subscribed() -> None:
    """A fuzz SUBSCRIBE to the canary queue would steal the canary's messages (a fuzz run
    lost receipted canary messages so): no SUBSCRIBE the mutator writes may name it as
    the broker's own parser reads it, in any version (a CR before LF is a line end)."""
    joined = b"".join(frames(5, ("subscribe", "headers"), batches=2000))
    subscribes = 0
    for chunk in joined.split(b"\x00"):
        if not chunk.lstrip(b"\r\n").startswith(b"SUBSCRIBE"):
            continue
        for version in (STOMP_1_0, STOMP_1_1, STOMP_1_2):
            try:
                parsed = FrameParser(version=version).feed(chunk.lstrip(b"\r\n") + b"\x00")
            except ProtocolError:
                continue  # the broker refuses it: it subscribes to nothing
            for frame in parsed:
                assert isinstance(frame, Frame)
                subscribes += 1
                assert frame.headers.get("destination") != DESTINATIONS["canary_queue"], (
                    f"STOMP {version}: {chunk!r}")
    assert subscribes > 1000  # the check saw the SUBSCRIBEs it is about
