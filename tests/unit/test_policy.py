"""The policy resolver (amqlite.policy) and its config-file tables: pure, no broker."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from amqlite.policy import (
    DeadLetterStrategy,
    DestinationPolicy,
    Overflow,
    Policies,
    PolicyError,
    parse_policies,
)
from amqlite.settings import SettingsError, load_settings


def resolver(*tables: dict[str, object]) -> Policies:
    return Policies(parse_policies(list(tables), "test.toml"),
                    DestinationPolicy(dead_letter_queue="/queue/DLQ", max_redeliveries=6))


def test_most_specific_pattern_wins_whatever_the_file_order() -> None:
    tables = [
        {"destination": "/queue/>", "max_redeliveries": 1},
        {"destination": "/queue/orders.>", "max_redeliveries": 2},
        {"destination": "/queue/orders.*", "max_redeliveries": 3},
        {"destination": "/queue/*.eu", "max_redeliveries": 4},
        {"destination": "/queue/orders.eu", "max_redeliveries": 5},
    ]
    for order in (tables, list(reversed(tables))):
        p = resolver(*order)
        assert p.resolve("/queue/orders.eu").max_redeliveries == 5  # the literal name
        assert p.resolve("/queue/orders.us").max_redeliveries == 3  # '*' beats '>'
        assert p.resolve("/queue/orders.us.east").max_redeliveries == 2
        assert p.resolve("/queue/billing.eu").max_redeliveries == 4  # 'orders.*' no match
        assert p.resolve("/queue/billing").max_redeliveries == 1
        assert p.resolve("/topic/orders.eu").max_redeliveries == 6  # no topic entry


def test_left_element_decides_between_wildcards() -> None:
    p = resolver({"destination": "/queue/a.*", "max_length": 1},
                 {"destination": "/queue/*.b", "max_length": 2})
    assert p.resolve("/queue/a.b").max_length == 1  # the literal first element wins


def test_unset_keys_come_from_the_broker_defaults_not_from_other_entries() -> None:
    p = resolver({"destination": "/queue/>", "max_length": 10, "message_ttl": 5},
                 {"destination": "/queue/orders", "max_redeliveries": 2})
    orders = p.resolve("/queue/orders")
    assert orders.max_redeliveries == 2
    assert orders.max_length == 0 and orders.message_ttl == 0  # no merge
    assert orders.dead_letter_queue == "/queue/DLQ"
    assert p.resolve("/queue/other").max_length == 10
    assert p.resolve("/queue/other").pattern == "/queue/>"
    assert p.resolve("/topic/x").pattern is None


def test_resolved_policies_are_immutable_shared_and_cached() -> None:
    p = resolver({"destination": "/queue/orders.>", "max_length": 3})
    first = p.resolve("/queue/orders.a")
    assert p.resolve("/queue/orders.a") is first
    assert p.resolve("/queue/orders.b") is first  # one object per entry
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.max_length = 4  # type: ignore[misc]
    assert p.any and p.limits_queues
    assert not Policies().any and not Policies().limits_queues


def test_without_entries_every_name_has_the_defaults_and_none_is_cached() -> None:
    p = Policies()
    assert all(p.resolve(f"/queue/churn.{i}") is p.defaults for i in range(1000))
    assert p._cache == {}


def test_individual_dead_letter_queue_per_destination() -> None:
    p = resolver({"destination": "/queue/>", "dead_letter_strategy": "individual"},
                 {"destination": "/topic/>", "dead_letter_prefix": "DEAD."},
                 {"destination": "/queue/special", "dead_letter_queue": "/queue/special.dlq"})
    assert p.resolve("/queue/orders").dead_letter_for("/queue/orders") == "/queue/DLQ.orders"
    assert p.resolve("/topic/prices").dead_letter_for("/topic/prices") == \
        "/queue/DEAD.Topic.prices"
    assert p.resolve("/queue/special").dead_letter_for("/queue/special") == \
        "/queue/special.dlq"
    assert p.resolve("/queue/special").dead_letter_strategy is DeadLetterStrategy.SHARED


def test_dead_letter_queue_is_checked_once_per_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A destination's dead-letter queue is derived and its name checked once, not per
    dead letter; one too long to be a destination falls back to the broker-wide one."""
    import amqlite.policy as policy_module
    checked: list[str] = []
    real = policy_module.check_destination

    def counting(name: str) -> str:
        checked.append(name)
        return real(name)

    monkeypatch.setattr(policy_module, "check_destination", counting)
    p = resolver({"destination": "/queue/>", "dead_letter_strategy": "individual"})
    for _ in range(3):
        assert p.dead_letter_queue("/queue/orders", "/queue/DLQ") == "/queue/DLQ.orders"
    assert checked == ["/queue/DLQ.orders"]
    long_name = "/queue/" + "x" * 5000
    for _ in range(2):
        assert p.dead_letter_queue(long_name, "/queue/DLQ") == "/queue/DLQ"
    assert len(checked) == 2


def test_redelivery_back_off_grows_and_is_capped() -> None:
    policy = resolver({"destination": "/queue/q", "redelivery_delay": 0.5,
                       "redelivery_multiplier": 2, "max_redelivery_delay": 3}).resolve("/queue/q")
    assert [policy.redelivery_delay_ms(n) for n in range(1, 6)] == [500, 1000, 2000, 3000, 3000]
    constant = resolver({"destination": "/queue/q", "redelivery_delay": 1}).resolve("/queue/q")
    assert [constant.redelivery_delay_ms(n) for n in (1, 2, 9)] == [1000, 1000, 1000]
    assert DestinationPolicy().redelivery_delay_ms(3) == 0
    huge = resolver({"destination": "/queue/q", "redelivery_delay": 1,
                     "redelivery_multiplier": 100}).resolve("/queue/q")
    assert huge.redelivery_delay_ms(1000) == 86_400_000  # capped at a day, no overflow


def test_ttl_default_and_cap() -> None:
    policy = resolver({"destination": "/queue/q", "message_ttl": 10,
                       "max_message_ttl": 60}).resolve("/queue/q")
    now = 1_000_000
    assert policy.expires_at(0, now) == now + 10_000  # none given: the default
    assert policy.expires_at(now + 5_000, now) == now + 5_000  # shorter: kept
    assert policy.expires_at(now + 3_600_000, now) == now + 60_000  # longer: capped
    cap_only = resolver({"destination": "/queue/q", "max_message_ttl": 60}).resolve("/queue/q")
    assert cap_only.expires_at(0, now) == now + 60_000  # "never" is capped too
    assert DestinationPolicy().expires_at(0, now) == 0


@pytest.mark.parametrize(("table", "words"), [
    ({"destination": "/queue/a.>", "max_lenght": 3}, "unknown key(s) max_lenght"),
    ({"max_length": 3}, "destination is missing"),
    ({"destination": "/queue/a>"}, "whole segments"),
    ({"destination": "queue/a"}, "must be /queue/PATTERN"),
    ({"destination": "/queue/a", "max_length": -1}, "max_length must be an integer >= 0"),
    ({"destination": "/queue/a", "max_length": True}, "max_length must be"),
    ({"destination": "/queue/a", "redelivery_delay": float("nan")}, "redelivery_delay must"),
    ({"destination": "/queue/a", "redelivery_multiplier": 0.5}, "from 1 to 100"),
    ({"destination": "/queue/a", "overflow": "reject"}, "overflow must be"),
    ({"destination": "/queue/a", "dead_letter_strategy": "each"}, "dead_letter_strategy must"),
    ({"destination": "/queue/a", "dead_letter_queue": "/topic/x"}, "must be a queue"),
    ({"destination": "/queue/a", "dead_letter_prefix": "a/b"}, "dead_letter_prefix must"),
    ({"destination": "/queue/a", "dead_letter_queue": "/queue/d",
      "dead_letter_strategy": "individual"}, "exclude each other"),
    ({"destination": "/topic/a", "max_length": 3}, "apply to queues"),
])
def test_a_bad_table_is_one_line_naming_it(table: dict[str, object], words: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policies([{"destination": "/queue/ok"}, table], "test.toml")
    message = str(e.value)
    assert "\n" not in message
    assert "[[policy]] #2" in message and words in message


def test_the_same_pattern_twice_is_refused() -> None:
    with pytest.raises(PolicyError, match="already the pattern of \\[\\[policy\\]\\] #1"):
        parse_policies([{"destination": "/queue/a.>"}, {"destination": "/queue/a.>"}], "f")


def test_config_file_tables_top_level_or_under_broker(tmp_path: Path) -> None:
    top = tmp_path / "top.toml"
    top.write_text('[broker]\ngroup = "g"\nmax_redeliveries = 2\n\n[[policy]]\n'
                   'destination = "/queue/orders.>"\nmax_length = 5\noverflow = "reject-publish"\n')
    s = load_settings(config_file=str(top), environ={})
    policy = s.destination_policies().resolve("/queue/orders.new")
    assert policy.max_length == 5 and policy.overflow is Overflow.REJECT_PUBLISH
    assert policy.max_redeliveries == 2  # the broker-wide setting is the default
    inner = tmp_path / "inner.toml"
    inner.write_text('[broker]\ngroup = "g"\n[[broker.policy]]\ndestination = "/queue/x"\n'
                     'message_ttl = 1.5\n')
    s = load_settings(config_file=str(inner), environ={})
    assert s.destination_policies().resolve("/queue/x").message_ttl == 1.5
    both = tmp_path / "both.toml"
    both.write_text('[[policy]]\ndestination = "/queue/x"\n[broker]\ngroup = "g"\n'
                    '[[broker.policy]]\ndestination = "/queue/y"\n')
    with pytest.raises(SettingsError, match="put them in one place"):
        load_settings(config_file=str(both), environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text('[[policy]]\ndestination = "/queue/x"\nmax_length = "ten"\n')
    with pytest.raises(SettingsError) as e:
        load_settings(config_file=str(bad), environ={})
    assert str(e.value).startswith("--config: ") and "max_length must be" in str(e.value)
