"""Back-off, attempt counting and URI order, against ActiveMQ FailoverTransport's rules."""

from __future__ import annotations

import random

from amqlite.client.failover import ReconnectPolicy, backoff_waits, connect_order, is_priority
from amqlite.client.uri import FailoverOptions, TcpURI, parse_broker_url

A, B, C, D = (TcpURI("h", port) for port in (1, 2, 3, 4))


def test_startup_waits_double_up_to_the_cap() -> None:
    # ActiveMQ defaults: 10 ms initial, x2, capped at 30 s; no wait before the first pass.
    waits = backoff_waits(FailoverOptions(), 15, first_connection=True)
    assert waits == [0, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240, 20480,
                     30000, 30000]


def test_reconnect_waits_before_and_after_each_pass() -> None:
    # After a connection drops ActiveMQ sleeps reconnectDelay before a pass (doReconnect)
    # and again after a failed one (doDelay, then multiply): gaps d0, d0+d1, d1+d2, ...
    options = parse_broker_url(
        "failover:(tcp://a:1)?initialReconnectDelay=100&maxReconnectDelay=1000"
    ).options
    assert backoff_waits(options, 6, first_connection=False) == [
        100, 100 + 200, 200 + 400, 400 + 800, 800 + 1000, 1000 + 1000]


def test_exponent_and_no_exponential_backoff() -> None:
    options = parse_broker_url(
        "failover:(tcp://a:1)?initialReconnectDelay=100&reconnectDelayExponent=3"
    ).options
    assert backoff_waits(options, 4, first_connection=True) == [0, 100, 300, 900]
    flat = parse_broker_url(
        "failover:(tcp://a:1)?initialReconnectDelay=50&useExponentialBackOff=false"
    ).options
    assert backoff_waits(flat, 4, first_connection=True) == [0, 50, 50, 50]
    assert backoff_waits(flat, 3, first_connection=False) == [50, 100, 100]


def test_startup_attempt_limit_then_max_attempts() -> None:
    options = FailoverOptions(startup_max_reconnect_attempts=3, max_reconnect_attempts=5)
    policy = ReconnectPolicy(options)
    outcomes = [policy.pass_failed() for _ in range(3)]
    assert [o.give_up for o in outcomes] == [False, False, True]
    policy = ReconnectPolicy(options)
    policy.connected()  # after the first connection, maxReconnectAttempts rules
    outcomes = [policy.pass_failed() for _ in range(5)]
    assert [o.give_up for o in outcomes] == [False, False, False, False, True]
    assert outcomes[-1].failures == 5


def test_startup_limit_unset_falls_back_to_max_attempts() -> None:
    assert len(backoff_waits(FailoverOptions(max_reconnect_attempts=2), 10,
                             first_connection=True)) == 2


def test_zero_attempts_means_no_reconnect() -> None:
    policy = ReconnectPolicy(FailoverOptions(max_reconnect_attempts=0))
    assert policy.pass_failed().give_up  # one pass at startup, then fail
    policy = ReconnectPolicy(FailoverOptions(max_reconnect_attempts=0))
    policy.connected()
    assert not policy.can_reconnect()
    assert ReconnectPolicy(FailoverOptions()).can_reconnect()


def test_success_resets_delay_and_count() -> None:
    policy = ReconnectPolicy(FailoverOptions())
    for _ in range(4):
        policy.pass_failed()
    assert policy.delay_ms == 160 and policy.failures == 4
    policy.connected()
    assert policy.delay_ms == 10 and policy.failures == 0


def test_warn_every_n_attempts() -> None:
    policy = ReconnectPolicy(FailoverOptions(warn_after_reconnect_attempts=3))
    warns = [policy.pass_failed().warn for _ in range(7)]
    assert warns == [False, False, True, False, False, True, False]
    quiet = ReconnectPolicy(FailoverOptions(warn_after_reconnect_attempts=0))
    assert not any(quiet.pass_failed().warn for _ in range(20))


def test_randomize_off_keeps_order_and_failed_goes_last() -> None:
    assert connect_order([A, B, C]) == [A, B, C]
    assert connect_order([A, B, C], failed=A) == [B, C, A]


def test_randomize_shuffles_per_pass() -> None:
    rng = random.Random(7)
    orders = {tuple(connect_order([A, B, C, D], randomize=True, rng=rng)) for _ in range(50)}
    assert len(orders) > 1
    assert all(sorted(o, key=lambda u: u.port) == [A, B, C, D] for o in orders)
    # the failed URI stays last even when shuffling
    assert all(connect_order([A, B, C], failed=B, randomize=True, rng=rng)[-1] == B
               for _ in range(20))


def test_updated_uris_come_first_in_given_order() -> None:
    assert connect_order([A, B], [D, C], randomize=True, rng=random.Random(1))[:2] == [D, C]
    assert connect_order([A, B], [B, C]) == [B, C, A]


def test_priority_uri() -> None:
    options = FailoverOptions(priority_backup=True)
    assert is_priority(A, options, [A, B]) and not is_priority(B, options, [A, B])
    explicit = FailoverOptions(priority_backup=True, priority_uris=(B,))
    assert is_priority(B, explicit, [A, B]) and not is_priority(A, explicit, [A, B])
    assert not is_priority(A, FailoverOptions(), [A, B])
