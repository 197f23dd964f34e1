"""Past max_unauthenticated, which socket goes (``amqlite.auth.crowded_out``, issue 23
item 2): one waiting for a passcode tried again and again, of a login with many of those
(``CheckQueue.oft_tried``) or sharing its check with other sockets, before the oldest,
so a login waiting for its check is not closed for a flood's sockets, nor for one
already refused; then one that has not sent its CONNECT yet; a client retrying its one
passcode is not such a guess. Pure logic: the sockets are stand-ins with the attributes
the choice reads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqlite.auth import (
    EVICTION_SCAN,
    RETRIED_PASSCODES_MAX,
    Authenticator,
    CheckQueue,
    crowded_out,
)


class Sock:
    """A socket not logged in: no CONNECT yet (None), or one whose passcode for
    ``login`` was tried ``seen`` times, waiting on ``group`` (its own check by default,
    hashable by identity, as a ClientConnection is)."""

    def __init__(self, seen: int | None, login: str, refused: bool = False,
                 group: SimpleNamespace | None = None) -> None:
        if group is None and not refused:
            group = SimpleNamespace(seen=seen, login=login, waiters=[])
        if group is not None:
            group.waiters.append(self)
        self.check = (None if seen is None
                      else SimpleNamespace(group=group, refused=refused))


def sock(seen: int | None, login: str = "flooded") -> Any:
    return Sock(seen, login)


def sharing(group: SimpleNamespace) -> Any:
    """A socket waiting on ``group``, a check other sockets wait on too."""
    return Sock(group.seen, group.login, group=group)


def refused() -> Any:
    """A socket whose CONNECT was answered no at once (a denial the cache knew, a full
    queue): the answer is a loop turn away, and it waits for no check."""
    return Sock(1, "flooded", refused=True)


def choice(socks: list[Any]) -> Any:
    """The choice among ``socks`` (oldest first, as the server's unauthenticated dict
    keeps them), with "flooded" a login with more passcodes tried again than a client
    retrying has, and "retrying" one with a single one."""
    checks = CheckQueue(Authenticator(None))
    for n in range(RETRIED_PASSCODES_MAX + 1):
        checks.retries.note("flooded", b"guess%d" % n)
    checks.retries.note("retrying", b"its passcode")
    return crowded_out(dict.fromkeys(socks), checks)


def test_a_socket_waiting_on_a_repeated_guess_goes_before_the_oldest() -> None:
    user, idle, guess = sock(1), sock(None), sock(40)
    assert choice([user, idle, guess, sock(1)]) is guess


def test_a_socket_that_said_nothing_goes_before_a_login_waiting_for_its_check() -> None:
    """A burst of new sockets (none has sent its CONNECT yet) must not close the login
    that waits for its password check: a CI run saw alice closed with "server busy"."""
    user, first_silent = sock(1), sock(None)
    assert choice([user, first_silent, sock(1), sock(None)]) is first_silent


def test_the_oldest_goes_when_every_one_waits_for_its_check() -> None:
    oldest = sock(1)
    assert choice([oldest, sock(1), sock(2, "other")]) is oldest


def test_a_client_retrying_its_one_passcode_is_not_taken_for_a_guess() -> None:
    oldest = sock(1)
    assert choice([oldest, sock(3, "retrying")]) is oldest


def test_only_the_oldest_few_are_looked_at() -> None:
    oldest = sock(1)
    late_guess = sock(40)
    assert choice([oldest, *[sock(1) for _ in range(EVICTION_SCAN)], late_guess]) \
        is oldest


def test_a_socket_already_refused_goes_before_a_login_waiting_for_its_check() -> None:
    """A burst of a wrong passcode the cache knows, read in one loop turn: each socket's
    denial is on its way and none waits for a check. A run under load closed alice's
    login, the oldest, with "server busy" (test_login_flood_one_login.py[same])."""
    user, first_refused = sock(1), refused()
    assert choice([user, first_refused, refused(), sock(None)]) is first_refused


def test_a_socket_sharing_its_check_goes_before_a_login_waiting_for_its_own() -> None:
    """A flood of one wrong passcode whose answer is not known (alice's password changed,
    so the cached denial no longer applies): hundreds of sockets wait on that one check,
    none of them silent or refused, the passcode not one of many (``oft_tried`` is
    false). CI runs under load closed alice's login, the oldest, with "server busy"
    (test_login_flood_one_login.py's warmed flood[same])."""
    user = sock(1)
    wrong = SimpleNamespace(seen=400, login="retrying", waiters=[])
    first_repeat = sharing(wrong)
    assert choice([user, first_repeat, sharing(wrong), sharing(wrong)]) is first_repeat


def test_one_socket_alone_on_its_check_is_not_taken_for_a_burst() -> None:
    oldest = sock(1)
    assert choice([oldest, sock(3, "retrying"), sock(1, "other")]) is oldest
