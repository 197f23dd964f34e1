"""``amqlite produce`` and ``amqlite consume``: the failover client from the command line.

Modelled on ActiveMQ's ``producer``/``consumer`` tools (``--brokerUrl --destination
--count --sleep``) so an operator can keep traffic flowing while stopping and starting
brokers, and read from the output what was sent, what arrived twice and how long each
failover took. One line per message on stdout (stderr with ``--json``, where stdout holds
only the JSON summary); connection events on stderr; errors are one line and exit 1.

Register on the CLI group with ``register(cli)``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import ssl
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import click

from amqlite.client import (
    AckNotConfirmedError,
    AsyncClient,
    ClientError,
    ConnectionFailedError,
    Interruption,
    Message,
    stomp_destination,
)
from amqlite.client.connection import describe
from amqlite.client.discovery import waiting_for
from amqlite.client.uri import URIError
from amqlite.tls import ClientTls, TlsError
from amqlite.wire import ACK_AUTO, ACK_MODES, DEFAULT_STOMP_PORT
from cli.private_file import read_password_file

__all__ = ["consume", "produce", "register"]

#: ActiveMQ's producer/consumer tools default to this broker URL and destination
#: (with the STOMP port instead of OpenWire's 61616).
DEFAULT_BROKER_URL = f"failover:(tcp://127.0.0.1:{DEFAULT_STOMP_PORT})"
DEFAULT_DESTINATION = "queue://TEST"
#: ActiveMQ's tools send/receive 1000 messages unless told otherwise.
DEFAULT_COUNT = 1000
#: Exit status when a command ran but did not do all it was asked (sends failed, too few
#: messages arrived), and for errors (bad URL, no broker).
EXIT_INCOMPLETE = 1
EXIT_ERROR = 1
#: Usage that cannot work (a password file that cannot be read): the README's exit codes.
EXIT_USAGE = 2
#: Conventional exit status after Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


def register(cli_group: click.Group) -> None:
    """Add ``produce`` and ``consume`` to the ``amqlite`` command group."""
    cli_group.add_command(produce)
    cli_group.add_command(consume)


def _fail(message: str) -> None:
    click.echo(f"amqlite: error: {message}", err=True)
    sys.exit(EXIT_ERROR)


def _destination(value: str) -> str:
    try:
        return stomp_destination(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


class _ClickLogHandler(logging.Handler):
    """The client's warnings (interruptions, retries) on stderr; its errors are reported
    by the command itself as the one error line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"amqlite: {record.levelname.lower()}: {record.getMessage()}", err=True)


def _setup_logging() -> None:
    client_log = logging.getLogger("amqlite.client")
    if not any(isinstance(h, _ClickLogHandler) for h in client_log.handlers):
        client_log.addHandler(_ClickLogHandler())
    client_log.setLevel(logging.WARNING)
    client_log.propagate = False
    # A discovery:zk:// lookup of a dead ZooKeeper makes kazoo log several lines a second;
    # the client's own "failed to connect ..., continuing to retry" says it once per
    # warnAfterReconnectAttempts passes.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


class _EventPrinter:
    """Transport listener: connection events to stderr, so gaps show up in the output."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.client: AsyncClient | None = None

    def _say(self, text: str) -> None:
        click.echo(f"[{time.monotonic() - self.started:8.3f}s] {text}", err=True)

    def on_interrupted(self) -> None:
        self._say("connection interrupted, failing over")

    def on_resumed(self) -> None:
        uri = self.client.connected_uri if self.client is not None else None
        self._say(f"connected to {uri}")

    def on_exception(self, exc: BaseException) -> None:
        if isinstance(exc, AckNotConfirmedError):  # giving up is the command's error line
            self._say(str(exc))


@dataclass
class _Report:
    """Counters shared by both commands; printed as text or JSON at the end."""

    command: str
    destination: str
    broker_url: str
    started: float = field(default_factory=time.monotonic)
    counts: Counter[str] = field(default_factory=Counter)
    interruptions: list[Interruption] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def gaps(self) -> list[float]:
        return [round(i.duration, 3) for i in self.interruptions if i.duration is not None]

    def as_dict(self) -> dict[str, Any]:
        gaps = self.gaps()
        return {
            "command": self.command,
            "destination": self.destination,
            "broker_url": self.broker_url,
            **dict(sorted(self.counts.items())),
            **self.extra,
            "failovers": len(self.interruptions),
            "failover_gaps_s": gaps,
            "max_failover_gap_s": max(gaps, default=0.0),
            "elapsed_s": round(time.monotonic() - self.started, 3),
        }


def _emit_summary(report: _Report, as_json: bool, text: str) -> None:
    data = report.as_dict()
    if as_json:
        click.echo(json.dumps(data, sort_keys=True))
        return
    gaps = ", ".join(f"{g:.3f}s" for g in data["failover_gaps_s"]) or "none"
    click.echo(f"{text}; failovers: {data['failovers']} (gaps: {gaps}); "
               f"elapsed {data['elapsed_s']:.3f}s")


def _run(main: Any, report: _Report, as_json: bool, summary: Any) -> None:
    """Run the command's coroutine; turn client errors into one line, Ctrl-C into a summary."""
    _setup_logging()
    try:
        ok = asyncio.run(main)
    except KeyboardInterrupt:
        _emit_summary(report, as_json, summary())
        sys.exit(EXIT_INTERRUPTED)
    except (URIError, ClientError, ValueError) as exc:
        _fail(str(exc))
    _emit_summary(report, as_json, summary())
    if not ok:
        sys.exit(EXIT_INCOMPLETE)


async def _connect_within(client: AsyncClient, timeout: float) -> None:
    """``client.connect()``, bounded by ``timeout`` seconds (0: unbounded): connecting and
    discovery must not outlast the --timeout the user gave. With a ``discovery:`` URL it
    first says on stderr what it waits for (a registry that is down answers nothing)."""
    waiting = waiting_for(client.url.text)
    if waiting is not None:
        limit = f"; giving up after --timeout {timeout:g}s" if timeout else ""
        click.echo(f"amqlite: {waiting}{limit}", err=True)
    if not timeout:
        await client.connect()
        return
    try:
        async with asyncio.timeout(timeout):
            await client.connect()
    except TimeoutError:
        reason = client.last_error
        await client.disconnect()
        why = f": {describe(reason)}" if reason is not None else ""
        raise ConnectionFailedError(
            f"no connection to {client.url.text} within --timeout {timeout:g}s{why}"
        ) from None


_common = [
    click.option("--brokerUrl", "--broker-url", "broker_url", default=DEFAULT_BROKER_URL,
                 show_default=True,
                 help="tcp://host:port, ssl://host:port, failover:(uri,...)?options or "
                      "discovery:AGENT."),
    click.option("--destination", default=DEFAULT_DESTINATION, show_default=True,
                 help="queue://NAME, topic://NAME, /queue/NAME or /topic/NAME."),
    click.option("--count", default=DEFAULT_COUNT, show_default=True,
                 type=click.IntRange(min=0), help="Messages to handle (consume: 0 = no limit)."),
    click.option("--user", default=None, envvar="AMQLITE_USER", help="STOMP login."),
    click.option("--password", default=None, envvar="AMQLITE_PASSWORD",
                 help="STOMP passcode; better --password-file or AMQLITE_PASSWORD (a "
                      "command line is visible to every user of the machine). Prompted "
                      "for when --user is given without one on a terminal."),
    click.option("--password-file", default=None, metavar="FILE",
                 help="Read the passcode from this file (its first line)."),
    click.option("--client-id", default=None, help="STOMP client-id (durable subscriptions)."),
    click.option("--json", "as_json", is_flag=True,
                 help="Print a JSON summary on stdout (per-message lines go to stderr)."),
]


_tls_options = [
    click.option("--ssl-ca", metavar="FILE",
                 help="PEM CA file to verify ssl:// brokers (default: the system's)."),
    click.option("--ssl-cert", metavar="FILE", help="Client certificate (PEM) for ssl://."),
    click.option("--ssl-key", metavar="FILE", help="Private key of --ssl-cert."),
    click.option("--no-verify-hostname", is_flag=True,
                 help="Accept a broker certificate that does not name the URI's host."),
]


def _passcode(user: str | None, given: str | None, password_file: str | None) -> str | None:
    """--password (or AMQLITE_PASSWORD), --password-file, or a prompt on a terminal."""
    if password_file:
        if given is not None:
            click.echo("amqlite: error: give --password-file or --password (AMQLITE_PASSWORD),"
                       " not both", err=True)
            sys.exit(EXIT_USAGE)
        try:
            return read_password_file(password_file)
        except OSError as exc:
            click.echo(f"amqlite: error: --password-file {password_file}: {exc.strerror}",
                       err=True)
        except ValueError as exc:
            click.echo(f"amqlite: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    if given is None and user is not None and sys.stdin.isatty():
        return str(click.prompt(f"passcode for {user}", hide_input=True, err=True))
    return given


def _with_common(fn: Any) -> Any:
    """The shared options; the TLS ones arrive in ``fn`` as one ``tls`` context (None
    when none was given), built here so a bad file is one line before any connect."""

    @functools.wraps(fn)
    def wrapper(ssl_ca: str | None, ssl_cert: str | None, ssl_key: str | None,
                no_verify_hostname: bool, password_file: str | None, **kwargs: Any) -> Any:
        kwargs["password"] = _passcode(kwargs["user"], kwargs["password"], password_file)
        tls = None
        if ssl_ca or ssl_cert or ssl_key or no_verify_hostname:
            try:
                tls = ClientTls(ssl_ca or "", ssl_cert or "", ssl_key or "",
                                not no_verify_hostname).context()
            except TlsError as exc:
                _fail(str(exc))
        return fn(tls=tls, **kwargs)

    for option in reversed(_common + _tls_options):
        wrapper = option(wrapper)
    return wrapper


@click.command()
@_with_common
@click.option("--sleep", default=0, show_default=True, type=click.IntRange(min=0),
              help="Milliseconds to wait between messages.")
@click.option("--persistent/--non-persistent", default=True, show_default=True,
              help="Persistent messages are confirmed by the broker after the commit.")
@click.option("--size", default=0, show_default=True, type=click.IntRange(min=0),
              help="Pad each body to this many bytes (0: just the message text).")
@click.option("--producer-id", default=None, help="Producer identity (default: a fresh uuid).")
@click.option("--timeout", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Give up connecting (discovery included) after this many seconds: one "
                   "error line, exit 1 (0: wait forever).")
def produce(broker_url: str, destination: str, count: int, user: str | None,
            password: str | None, client_id: str | None, as_json: bool, sleep: int,
            persistent: bool, size: int, producer_id: str | None, timeout: float,
            tls: ssl.SSLContext | None) -> None:
    """Send COUNT messages, one line each once the broker confirmed it."""
    dest = _destination(destination)
    report = _Report("produce", dest, broker_url)
    report.counts.update(dict.fromkeys(("sent", "failed", "resent_after_failover"), 0))
    out_err = as_json

    async def main() -> bool:
        printer = _EventPrinter()
        client = AsyncClient(broker_url, login=user, passcode=password, client_id=client_id,
                             producer_id=producer_id, listener=printer, tls=tls)
        printer.client = client
        report.extra["producer_id"] = client.producer_id
        report.interruptions = client.interruptions
        await _connect_within(client, timeout)
        try:
            for number in range(1, count + 1):
                text = f"message {number} from {client.producer_id}"
                body = text.encode().ljust(size, b".") if size else text.encode()
                try:
                    result = await client.send(dest, body, persistent=persistent,
                                               content_type="text/plain;charset=utf-8")
                except ClientError as exc:
                    report.counts["failed"] += 1
                    click.echo(f"failed {number}/{count}: {exc}", err=True)
                    if client.closed:
                        break
                    continue
                report.counts["sent"] += 1
                state = "confirmed" if persistent else "written"
                click.echo(f"sent {number}/{count} {dest} seq={result.seq} "
                           f"{len(body)} bytes {state}", err=out_err)
                if sleep and number < count:
                    await asyncio.sleep(sleep / 1000)
        finally:
            report.counts["resent_after_failover"] = client.resent
            await client.disconnect()
        return report.counts["sent"] == count

    def summary() -> str:
        c = report.counts
        return (f"produced {c['sent']}/{count} to {dest} ({c['failed']} failed, "
                f"{c['resent_after_failover']} re-sent after failover)")

    _run(main(), report, as_json, summary)


@click.command()
@_with_common
@click.option("--ack", "ack_mode", default=ACK_AUTO, show_default=True,
              type=click.Choice(ACK_MODES),
              help="Acknowledgement mode; client modes ack every message.")
@click.option("--timeout", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Give up connecting, and stop after a message gap, after this many "
                   "seconds (0: wait forever).")
@click.option("--durable", default=None,
              help="Durable topic subscription name (needs --client-id).")
@click.option("--prefetch", default=None, type=click.IntRange(min=1),
              help="activemq.prefetchSize of the subscription.")
def consume(broker_url: str, destination: str, count: int, user: str | None,
            password: str | None, client_id: str | None, as_json: bool, ack_mode: str,
            timeout: float, durable: str | None, prefetch: int | None,
            tls: ssl.SSLContext | None) -> None:
    """Receive COUNT messages (0: until --timeout or Ctrl-C), one line each.

    A message whose producer identity (or message-id) was already seen is flagged
    DUPLICATE; gaps in a producer's sequence are counted in the summary.
    """
    dest = _destination(destination)
    if durable and not client_id:
        raise click.UsageError("--durable needs --client-id (a durable subscription belongs "
                               "to a client-id)")
    report = _Report("consume", dest, broker_url)
    report.counts.update(dict.fromkeys(
        ("received", "unique", "duplicates", "redelivered", "acks_unconfirmed"), 0))
    seen: set[tuple[str, int] | str] = set()
    sequences: dict[str, set[int]] = {}

    async def main() -> bool:
        printer = _EventPrinter()
        client = AsyncClient(broker_url, login=user, passcode=password, client_id=client_id,
                             listener=printer, tls=tls)
        printer.client = client
        report.interruptions = client.interruptions
        await _connect_within(client, timeout)
        try:
            sub = await client.subscribe(dest, ack=ack_mode, durable_name=durable,
                                         prefetch=prefetch)
            while count == 0 or report.counts["received"] < count:
                message = await sub.receive(timeout or None)
                if message is None:
                    break
                _record(message)
                if ack_mode != ACK_AUTO and not await client.ack(message):
                    report.counts["acks_unconfirmed"] += 1
        finally:
            await client.disconnect()
        return count == 0 or report.counts["received"] >= count

    def _record(message: Message) -> None:
        report.counts["received"] += 1
        identity = message.identity
        key: tuple[str, int] | str = identity if identity is not None else message.message_id
        flags = []
        if message.redelivered:
            report.counts["redelivered"] += 1
            flags.append("redelivered")
        if key in seen:
            report.counts["duplicates"] += 1
            flags.append("DUPLICATE")
        seen.add(key)
        if identity is not None:
            sequences.setdefault(identity[0], set()).add(identity[1])
        where = f"seq={identity[0][:12]}:{identity[1]}" if identity else message.message_id
        click.echo(f"received {report.counts['received']} {message.destination} {where} "
                   f"{len(message.body)} bytes {' '.join(flags)}".rstrip(), err=as_json)

    def summary() -> str:
        missing = sum(max(s) - min(s) + 1 - len(s) for s in sequences.values())
        report.counts["unique"] = len(seen)
        report.extra["sequence_gaps"] = missing
        c = report.counts
        return (f"consumed {c['received']} from {dest} ({c['unique']} unique, "
                f"{c['duplicates']} duplicates, {c['redelivered']} redelivered, "
                f"{c['acks_unconfirmed']} acks unconfirmed, {missing} missing in sequences)")

    _run(main(), report, as_json, summary)
