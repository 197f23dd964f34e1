"""TLS everywhere (issue 16): STOMP over TLS for stomp.py and amqlite.client, failover
between two TLS brokers, client certificates required and refused, HTTPS management API,
and bad certificate settings refused at start in one line."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import stomp

from amqlite.client import Client, ClientTls, ConnectionFailedError
from tests.helpers.broker_proc import (
    HOST,
    WAIT,
    BrokerFactory,
    BrokerProcess,
    Collector,
    amqlite_command,
    unique,
    wait_one_serving,
)
from tests.helpers.poll import poll
from tests.helpers.servers import free_port
from tests.helpers.tls import Pki, make_pki

pytestmark = pytest.mark.integration

#: A refused start must end this soon: it checks files, it does not wait for anything.
START_REFUSAL_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_args(pki: Pki, port: int, *, ca: bool = False) -> list[str]:
    """Only a TLS listener (``--bind off``) on ``port``."""
    args = ["--ssl-bind", f"{HOST}:{port}", "--bind", "off",
            "--ssl-cert", str(pki.server_cert), "--ssl-key", str(pki.server_key),
            "--http", "off"]
    return args + (["--ssl-ca", str(pki.ca)] if ca else [])


def start_tls(factory: BrokerFactory, pki: Pki, **kwargs: object) -> BrokerProcess:
    port = free_port()
    ca = bool(kwargs.pop("ca", False))
    return factory.start(port=port, extra_args=tls_args(pki, port, ca=ca), **kwargs)


def stomp_tls(port: int, pki: Pki, *, cert: bool = False) -> tuple[stomp.Connection12, Collector]:
    conn = stomp.Connection12([(HOST, port)], heartbeats=(0, 0))
    conn.set_ssl(for_hosts=[(HOST, port)], ca_certs=str(pki.ca),
                 cert_file=str(pki.client_cert) if cert else None,
                 key_file=str(pki.client_key) if cert else None)
    listener = Collector()
    conn.set_listener("collector", listener)
    return conn, listener


def refused(url: str, tls: ClientTls | None = None) -> str:
    """Connect and expect a refusal; its message."""
    client = Client(url, tls=tls)
    try:
        with pytest.raises(ConnectionFailedError) as info:
            client.connect()
    finally:
        client.close()
    return str(info.value)


def test_stomp_py_over_tls(broker_factory: BrokerFactory, pki: Pki) -> None:
    broker = start_tls(broker_factory, pki)
    conn, listener = stomp_tls(broker.port, pki)
    conn.connect(wait=True)
    try:
        queue = f"/queue/{unique('tls')}"
        conn.subscribe(queue, id="1", ack="auto")
        conn.send(queue, "over tls", receipt="r1")
        [frame] = listener.wait_messages(1)
        assert frame.body == "over tls"
    finally:
        conn.disconnect()
    log = broker.log_text()
    assert f"ssl://{HOST}:{broker.port}" in log and "tcp://" not in log.split("master of")[-1]


def test_plain_and_tls_listeners_side_by_side(broker_factory: BrokerFactory, pki: Pki) -> None:
    ssl_port = free_port()
    broker = broker_factory.start(extra_args=[
        "--ssl-bind", f"{HOST}:{ssl_port}", "--ssl-cert", str(pki.server_cert),
        "--ssl-key", str(pki.server_key), "--http", "off"])
    queue = f"/queue/{unique('both')}"
    with Client(f"tcp://{HOST}:{broker.port}") as plain:
        plain.send(queue, "plain")
    with Client(f"ssl://{HOST}:{ssl_port}", tls=ClientTls(ca_file=str(pki.ca))) as secure:
        sub = secure.subscribe(queue)
        message = sub.receive(WAIT)
        assert message is not None and message.body == b"plain"


def test_amqlite_client_verifies_the_server(broker_factory: BrokerFactory, pki: Pki) -> None:
    broker = start_tls(broker_factory, pki)
    url = f"ssl://{HOST}:{broker.port}?connectionTimeout=5000"
    queue = f"/queue/{unique('client')}"
    with Client(url, tls=ClientTls(ca_file=str(pki.ca))) as client:
        client.send(queue, "verified")
        message = client.subscribe(queue).receive(WAIT)
        assert message is not None and message.body == b"verified"
    # Without our CA the system store does not know the broker: refused, not ignored.
    assert "CERTIFICATE_VERIFY_FAILED" in refused(url)
    # Hostname verification is on by default: the certificate names 127.0.0.1 only.
    assert "CERTIFICATE_VERIFY_FAILED" in refused(
        f"ssl://localhost:{broker.port}?connectionTimeout=5000", ClientTls(ca_file=str(pki.ca)))


def test_failover_between_two_tls_brokers(broker_factory: BrokerFactory, pki: Pki) -> None:
    shared = broker_factory.data_dir("shared")
    env = {"AMQLITE_LOCK_POLL_INTERVAL": "0.1"}
    ports = [free_port(), free_port()]
    brokers = [broker_factory.new(data_dir=shared, name=f"tls-{i}", port=p, env=env,
                                  extra_args=tls_args(pki, p)).start()
               for i, p in enumerate(ports)]
    master, _ = wait_one_serving(brokers)
    slave = brokers[1] if master is brokers[0] else brokers[0]
    url = (f"failover:(ssl://{HOST}:{ports[0]},ssl://{HOST}:{ports[1]})"
           "?initialReconnectDelay=50&maxReconnectDelay=500")
    queue = f"/queue/{unique('fo')}"
    with Client(url, tls=ClientTls(ca_file=str(pki.ca))) as client:
        client.send(queue, "before")
        assert client.connected_uri is not None and client.connected_uri.port == master.port
        master.kill()
        slave.wait_serving(timeout=30)
        client.send(queue, "after")  # waits for the reconnect, then for the RECEIPT
        assert client.connected_uri is not None and client.connected_uri.port == slave.port
        sub = client.subscribe(queue)
        got = [sub.receive(WAIT), sub.receive(WAIT)]
        assert [m.body for m in got if m is not None] == [b"before", b"after"]


def test_client_certificate_required(broker_factory: BrokerFactory, pki: Pki) -> None:
    broker = start_tls(broker_factory, pki, ca=True)
    url = f"ssl://{HOST}:{broker.port}?connectionTimeout=5000"
    refused(url, ClientTls(ca_file=str(pki.ca)))  # no certificate
    refused(url, ClientTls(ca_file=str(pki.ca), cert_file=str(pki.rogue_cert),
                           key_file=str(pki.rogue_key)))
    with Client(url, tls=ClientTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert),
                                   key_file=str(pki.client_key))) as client:
        client.send(f"/queue/{unique('mtls')}", "with a certificate")
    conn, _ = stomp_tls(broker.port, pki, cert=True)  # stomp.py with a certificate too
    conn.connect(wait=True)
    assert conn.is_connected()
    conn.disconnect()


def test_https_management_api(broker_factory: BrokerFactory, pki: Pki) -> None:
    http_port = free_port()
    broker = broker_factory.start(extra_args=[
        "--ssl-cert", str(pki.server_cert), "--ssl-key", str(pki.server_key),
        "--http", f"{HOST}:{http_port}"])
    url = f"https://{HOST}:{http_port}/api/v1/node"
    context = ssl.create_default_context(cafile=str(pki.ca))

    def get_node() -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(url, context=context, timeout=WAIT) as resp:
                return json.loads(resp.read())  # type: ignore[no-any-return]
        except OSError:
            return None

    node, _ = poll(get_node, timeout=WAIT, what=f"the HTTPS management API at {url}")
    assert node["http"] == f"https://{HOST}:{http_port}"
    # The CLI's --url https with --ssl-ca.
    out = subprocess.run(
        [*amqlite_command(), "status", "--url", f"https://{HOST}:{http_port}",
         "--ssl-ca", str(pki.ca), "--json"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert broker.alive


@pytest.mark.parametrize("case", ["expired", "mismatch", "unreadable"])
def test_bad_certificate_refused_at_start(broker_factory: BrokerFactory, pki: Pki,
                                          case: str, tmp_path: Path) -> None:
    cert, key = pki.server_cert, pki.server_key
    expected = ""
    if case == "expired":
        cert, key, expected = pki.expired_cert, pki.expired_key, "expired"
    elif case == "mismatch":
        key, expected = pki.other_key, "does not match"
    else:
        cert, expected = tmp_path / "missing.pem", "cannot read"
    port = free_port()
    broker = broker_factory.new(port=port, extra_args=[
        "--ssl-bind", f"{HOST}:{port}", "--ssl-cert", str(cert), "--ssl-key", str(key)])
    broker.start()
    code = broker.wait_exit(START_REFUSAL_TIMEOUT)
    assert code != 0
    lines = [ln for ln in broker.log_text().splitlines() if not ln.startswith("=== harness")]
    assert len(lines) == 1, lines
    assert expected in lines[0] and "Traceback" not in lines[0]


def test_registry_advertises_ssl_and_discovery_prefers_it(broker_factory: BrokerFactory,
                                                          pki: Pki) -> None:
    from tests.helpers.cluster import amqlite, cluster_json, ok

    data = broker_factory.data_dir("both")
    store = f"sqlite:///{data / 'amqlite.db'}"
    group = unique("tlsgroup")
    ssl_port = free_port()
    broker = broker_factory.start(data_dir=data, group=group, extra_args=[
        "--ssl-bind", f"{HOST}:{ssl_port}", "--ssl-cert", str(pki.server_cert),
        "--ssl-key", str(pki.server_key), "--http", "off"])
    wanted = [f"tcp://{HOST}:{broker.port}", f"ssl://{HOST}:{ssl_port}"]
    poll(lambda: cluster_json("--registry", store),
         lambda v: any(r["services"] == wanted for r in v), timeout=30,
         what="both URIs listed")
    table = ok(amqlite("cluster-list", "--registry", store))
    assert f"ssl://{HOST}:{ssl_port}" in table
    # A client with TLS settings takes the ssl:// URI the registry gives, not tcp://.
    url = f"discovery:({store})?group={group}&maxReconnectAttempts=3"
    with Client(url, tls=ClientTls(ca_file=str(pki.ca))) as client:
        assert client.connected_uri is not None and client.connected_uri.tls
        assert client.connected_uri.port == ssl_port
        client.send(f"/queue/{unique('disc')}", "found by discovery")


def test_produce_and_consume_commands_over_tls(broker_factory: BrokerFactory, pki: Pki) -> None:
    broker = start_tls(broker_factory, pki, ca=True)
    queue = f"/queue/{unique('cliq')}"
    tls = ["--ssl-ca", str(pki.ca), "--ssl-cert", str(pki.client_cert),
           "--ssl-key", str(pki.client_key)]
    root = Path(__file__).resolve().parents[2]
    url = f"ssl://{HOST}:{broker.port}"
    produced = subprocess.run(
        [*amqlite_command(), "produce", "--brokerUrl", url, "--destination", queue,
         "--count", "3", *tls], capture_output=True, text=True, timeout=60, cwd=root)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [*amqlite_command(), "consume", "--brokerUrl", url, "--destination", queue,
         "--count", "3", "--timeout", "10", "--json", *tls],
        capture_output=True, text=True, timeout=60, cwd=root)
    assert consumed.returncode == 0, consumed.stderr
    assert json.loads(consumed.stdout)["received"] == 3
    # Without the client certificate the broker refuses: one line, non-zero exit.
    refused_run = subprocess.run(
        [*amqlite_command(), "produce", "--brokerUrl", url, "--destination", queue,
         "--count", "1", "--ssl-ca", str(pki.ca)],
        capture_output=True, text=True, timeout=60, cwd=root)
    assert refused_run.returncode != 0 and "Traceback" not in refused_run.stderr
    bad_ca = subprocess.run(
        [*amqlite_command(), "produce", "--brokerUrl", url, "--ssl-ca", "/nonexistent.pem"],
        capture_output=True, text=True, timeout=60, cwd=root)
    assert bad_ca.returncode != 0 and "cannot read CA file" in bad_ca.stderr
    assert len(bad_ca.stderr.strip().splitlines()) == 1
