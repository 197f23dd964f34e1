"""``amqlite produce`` / ``amqlite consume`` against the test server (own loop thread)."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from cli.client_cmds import register
from tests.client.stomp_server import ServerThread
from tests.helpers.servers import free_port


@click.group()
def amqlite() -> None:
    """Stand-in for the lead's group: register() must be all it takes."""


register(amqlite)


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ServerThread() as st:
        yield st


def test_produce_prints_a_line_per_message_and_a_summary(server: ServerThread) -> None:
    url = f"failover:({server.server.uri})?randomize=false"
    result = CliRunner().invoke(amqlite, [
        "produce", "--brokerUrl", url, "--destination", "queue://cli", "--count", "3",
        "--sleep", "1", "--size", "64", "--producer-id", "cli-p"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:3] for line in lines[:3]] == [
        ["sent", "1/3", "/queue/cli"], ["sent", "2/3", "/queue/cli"], ["sent", "3/3", "/queue/cli"]]
    assert lines[3].startswith("produced 3/3 to /queue/cli (0 failed")
    stored = server.do(lambda: list(server.server.stored))
    assert [len(f.body) for f in stored] == [64, 64, 64]
    assert [f.headers["amqlite.producerSeq"] for f in stored] == ["1", "2", "3"]


def test_consume_json_counts_duplicates_and_sequence_gaps(server: ServerThread) -> None:
    def publish() -> None:
        for seq in ("1", "2", "2", "4"):  # one duplicate, seq 3 missing
            server.server.publish("/queue/in", f"m{seq}".encode(), {
                "amqlite.producerId": "p", "amqlite.producerSeq": seq})

    server.do(publish)
    result = CliRunner().invoke(amqlite, [
        "consume", "--brokerUrl", server.server.uri, "--destination", "/queue/in",
        "--count", "4", "--ack", "client-individual", "--json"])
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["received"], summary["unique"], summary["duplicates"]) == (4, 3, 1)
    assert summary["sequence_gaps"] == 1
    assert summary["failovers"] == 0 and summary["redelivered"] == 0
    assert "DUPLICATE" in result.stderr  # per-message lines went to stderr
    assert len(server.do(lambda: list(server.server.acks))) == 4


def test_consume_stops_after_idle_timeout_and_reports_incomplete(server: ServerThread) -> None:
    result = CliRunner().invoke(amqlite, [
        "consume", "--brokerUrl", server.server.uri, "--destination", "queue://empty",
        "--count", "1", "--timeout", "0.1"])
    assert result.exit_code == 1
    assert "consumed 0 from /queue/empty" in result.stdout


@pytest.mark.parametrize(("args", "culprit"), [
    (["--brokerUrl", "failover:(tcp://127.0.0.1:1)?randomise=false"], "randomise"),
    (["--brokerUrl", f"tcp://127.0.0.1:{free_port()}"], "failed to connect"),
])
def test_errors_are_one_line_and_exit_nonzero(args: list[str], culprit: str) -> None:
    result = CliRunner().invoke(amqlite, ["produce", "--count", "1", *args])
    assert result.exit_code == 1
    assert result.stderr.count("amqlite: error") == 1
    assert culprit in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr


def test_bad_destination_is_a_usage_error() -> None:
    result = CliRunner().invoke(amqlite, ["consume", "--destination", "nowhere"])
    assert result.exit_code == 2
    assert "queue://NAME" in result.stderr
