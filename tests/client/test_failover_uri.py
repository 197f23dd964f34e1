"""Broker URL parsing: every accepted form, nested.*, and errors that name the culprit."""

from __future__ import annotations

import pytest

from amqlite.client.uri import (
    ACTIVEMQ_FAILOVER_DEFAULTS,
    FailoverOptions,
    TcpURI,
    URIError,
    parse_broker_url,
    parse_tcp_uri,
    parse_uri_list,
)

#: ActiveMQ 5.x FailoverTransport's defaults, written out independently of the code under
#: test (field initialisers of FailoverTransport.java; maxCacheSize = 128 * 1024).
ACTIVEMQ_DEFAULTS = {
    "initialReconnectDelay": 10,
    "maxReconnectDelay": 30000,
    "useExponentialBackOff": True,
    "reconnectDelayExponent": 2.0,
    "maxReconnectAttempts": -1,
    "startupMaxReconnectAttempts": -1,
    "randomize": True,
    "backup": False,
    "timeout": -1,
    "trackMessages": False,
    "maxCacheSize": 131072,
    "updateURIsSupported": True,
    "updateURIsURL": None,
    "warnAfterReconnectAttempts": 10,
    "reconnectSupported": True,
    "priorityBackup": False,
    "priorityURIs": (),
}


def test_option_defaults_equal_activemq() -> None:
    assert ACTIVEMQ_FAILOVER_DEFAULTS == ACTIVEMQ_DEFAULTS
    parsed = parse_broker_url("failover:(tcp://a:1)").options
    assert parsed == FailoverOptions()


def test_tcp_uri() -> None:
    url = parse_broker_url("tcp://broker.example:61614")
    assert url.kind == "tcp"
    assert url.uris == (TcpURI("broker.example", 61614),)
    # plain tcp: one pass, never reconnect (ActiveMQ's tcp transport)
    assert url.options.max_reconnect_attempts == 0
    assert url.options.startup_max_reconnect_attempts == 0


def test_tcp_default_port_ipv6_and_stomp_alias() -> None:
    assert parse_tcp_uri("tcp://h").port == 61613
    uri = parse_tcp_uri("stomp://[::1]:7000")
    assert (uri.host, uri.port, uri.scheme) == ("::1", 7000, "stomp")
    assert str(uri) == "stomp://[::1]:7000"


def test_tcp_options() -> None:
    uri = parse_tcp_uri("tcp://h:1?connectionTimeout=500&heartBeat=1000,2000")
    assert uri.options.connection_timeout_ms == 500
    assert uri.options.heartbeat_ms == (1000, 2000)


def test_failover_parenthesised_with_options() -> None:
    url = parse_broker_url(
        "failover:(tcp://a:1,tcp://b:2?connectionTimeout=700)?randomize=false"
        "&initialReconnectDelay=100&maxReconnectAttempts=3&useExponentialBackOff=false"
        "&reconnectDelayExponent=1.5&timeout=2000&backup=true&trackMessages=true"
        "&maxCacheSize=10&warnAfterReconnectAttempts=0&startupMaxReconnectAttempts=2"
    )
    assert url.kind == "failover"
    assert [(u.host, u.port) for u in url.uris] == [("a", 1), ("b", 2)]
    assert url.uris[1].options.connection_timeout_ms == 700
    o = url.options
    assert (o.randomize, o.initial_reconnect_delay, o.max_reconnect_attempts) == (False, 100, 3)
    assert (o.use_exponential_backoff, o.reconnect_delay_exponent, o.timeout) == (False, 1.5, 2000)
    assert (o.backup, o.track_messages, o.max_cache_size) == (True, True, 10)
    assert (o.warn_after_reconnect_attempts, o.startup_max_reconnect_attempts) == (0, 2)


def test_failover_without_parentheses() -> None:
    url = parse_broker_url("failover:tcp://a:1,tcp://b:2")
    assert [u.port for u in url.uris] == [1, 2]
    assert url.options == FailoverOptions()


def test_failover_double_slash_form_and_duplicates_dropped() -> None:
    url = parse_broker_url("failover://(tcp://a:1,tcp://A:1,tcp://b:2)?randomize=false")
    assert [u.port for u in url.uris] == [1, 2]
    assert url.options.randomize is False


def test_nested_options_apply_to_every_inner_uri_and_win() -> None:
    url = parse_broker_url(
        "failover:(tcp://a:1?connectionTimeout=100,tcp://b:2)?nested.connectionTimeout=900"
        "&nested.heartBeat=0,0&priorityBackup=true&priorityURIs=tcp://b:2"
    )
    assert [u.options.connection_timeout_ms for u in url.uris] == [900, 900]
    assert [u.options.heartbeat_ms for u in url.uris] == [(0, 0), (0, 0)]
    assert url.options.nested_map() == {"connectionTimeout": "900", "heartBeat": "0,0"}
    assert url.options.priority_uris == (TcpURI("b", 2),)
    assert url.options.priority_uris[0].options.connection_timeout_ms == 900


def test_update_uris_url_and_percent_decoding() -> None:
    url = parse_broker_url("failover:(tcp://a:1)?updateURIsURL=file%3A%2F%2F%2Ftmp%2Fu.txt")
    assert url.options.update_uris_url == "file:///tmp/u.txt"


def test_discovery_forms() -> None:
    url = parse_broker_url("discovery:(fabric:default)?randomize=false&maxReconnectAttempts=5")
    assert (url.kind, url.discovery, url.uris) == ("discovery", "fabric:default", ())
    assert url.options.randomize is False and url.options.max_reconnect_attempts == 5
    bare = parse_broker_url("discovery:fabric:default?nested.connectionTimeout=50")
    assert bare.discovery == "fabric:default"
    assert bare.options.nested_map() == {"connectionTimeout": "50"}


def test_discovery_agent_keeps_its_own_parameters() -> None:
    # amqlite.client.discovery's forms: the registry URL and its group stay with the agent
    url = parse_broker_url("discovery:zk://127.0.0.1:2181/amqlite?group=default&randomize=false")
    assert url.discovery == "zk://127.0.0.1:2181/amqlite?group=default"
    assert url.options.randomize is False
    url = parse_broker_url("discovery:(zk://zk1:2181,zk2:2181/amqlite)?group=orders&timeout=5")
    assert url.discovery == "zk://zk1:2181,zk2:2181/amqlite?group=orders"
    assert url.options.timeout == 5
    url = parse_broker_url("discovery:(postgresql://db/amq?sslmode=require)?group=g")
    assert url.discovery == "postgresql://db/amq?sslmode=require&group=g"


def test_uri_list() -> None:
    uris = parse_uri_list("tcp://a:1, tcp://b:2\ntcp://a:1", {"connectionTimeout": "5"})
    assert [u.port for u in uris] == [1, 2]
    assert uris[0].options.connection_timeout_ms == 5


@pytest.mark.parametrize(
    ("url", "culprit"),
    [
        ("", "empty"),
        ("http://a:1", "'http'"),
        ("tcp://", "no host"),
        ("tcp://a:99999", "tcp://a:99999"),
        ("tcp://a:notaport", "tcp://a:notaport"),
        ("tcp://user:pw@a:1", "tcp://user:pw@a:1"),
        ("tcp://a:1?bogus=1", "'bogus'"),
        ("tcp://a:1?heartBeat=10", "heartBeat"),
        ("failover:(tcp://a:1)?randomise=false", "'randomise'"),
        ("failover:(tcp://a:1)?randomize=maybe", "randomize"),
        ("failover:(tcp://a:1)?maxReconnectAttempts=-2", "maxReconnectAttempts"),
        ("failover:(tcp://a:1)?initialReconnectDelay=soon", "initialReconnectDelay"),
        ("failover:(tcp://a:1)?reconnectDelayExponent=0", "reconnectDelayExponent"),
        ("failover:(tcp://a:1)?connectionTimeout=5", "nested.connectionTimeout"),
        ("failover:(tcp://a:1)?nested.bogus=5", "'bogus'"),
        ("failover:(tcp://a:1)?randomize", "'randomize'"),
        ("failover:(tcp://a:1)?timeout=1&timeout=2", "'timeout' given twice"),
        ("failover:(tcp://a:1)?priorityURIs=udp://x:1", "priorityURIs"),
        ("failover:(tcp://a:1", "unbalanced"),
        ("failover:(tcp://a:1)x", "'x'"),
        ("failover:()", "empty URI"),
        ("failover:(tcp://a:1,,tcp://b:2)", "empty URI"),
        ("failover:(failover:(tcp://a:1))", "nested"),
        ("failover:tcp://a:1?randomize=false", "failover option"),
        ("failover:(tcp://a:1,ftp://b:2)", "'ftp'"),
        ("discovery:", "no discovery agent"),
        ("discovery:(zk://h:1/r)?group=g&randomise=false", "'randomise'"),
        ("nonsense", "nonsense"),
    ],
)
def test_bad_urls_name_the_culprit(url: str, culprit: str) -> None:
    with pytest.raises(URIError) as info:
        parse_broker_url(url)
    assert culprit in str(info.value)


def test_unknown_option_suggests_the_right_name() -> None:
    with pytest.raises(URIError, match="did you mean 'maxReconnectDelay'"):
        parse_broker_url("failover:(tcp://a:1)?maxReconnectDelai=5")
