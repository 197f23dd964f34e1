"""Harness for end-to-end tests: real `amqlite start` processes.

Every broker runs in its own session with its own log file so a test can SIGKILL,
SIGTERM or SIGSTOP exactly that process and so a failing test can show what the
brokers said. The STOMP clients that talk to them are in ``stomp_clients`` and
``raw_stomp``; ``broker_proc`` re-exports all three.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tests.helpers.poll import poll
from tests.helpers.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
#: How long a broker may take to import, open its store and listen.
START_TIMEOUT = 30.0
#: Default deadline for a frame exchange with a healthy local broker.
WAIT = 10.0
#: Lines of each broker log shown when a test fails.
LOG_TAIL_LINES = 120


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment minus stray AMQLITE_* settings (a developer's shell must not
    change what a test runs), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMQLITE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def amqlite_command() -> list[str]:
    """How to run the CLI: `python -m cli` if the package is runnable, else the console script.

    The console script sits next to the venv's interpreter (do not resolve symlinks: the
    venv's bin directory is what matters).
    """
    if (REPO_ROOT / "cli" / "__main__.py").exists():
        return [sys.executable, "-m", "cli"]
    script = Path(sys.executable).parent / "amqlite"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def unique(prefix: str) -> str:
    """A name no other test (or earlier run against the same store) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class BrokerProcess:
    """One `amqlite start` process: start, observe, signal, read its log."""

    def __init__(
        self,
        *,
        data_dir: Path,
        log_path: Path,
        name: str,
        group: str = "default",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.name = name
        self.group = group
        self.port = port if port is not None else free_port()
        self.env = dict(env or {})
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = "running" if self.alive else f"exited({self.returncode})"
        return f"<BrokerProcess {self.name} port={self.port} {state}>"

    @property
    def argv(self) -> list[str]:
        return [
            *amqlite_command(),
            "start",
            "--group", self.group,
            "--data-dir", str(self.data_dir),
            "--bind", f"{HOST}:{self.port}",
            "--name", self.name,
            *self.extra_args,
        ]

    def _environ(self) -> dict[str, str]:
        return cli_env(self.env)

    def start(self) -> BrokerProcess:
        """Spawn the process (again, after it stopped: same data dir, same port)."""
        if self.alive:
            raise RuntimeError(f"{self} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%H:%M:%S")
            log.write(f"=== harness: start {self.name} on port {self.port} at {stamp}: "
                      f"{' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environ(),
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "broker never started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def is_serving(self) -> bool:
        """True when the STOMP port accepts TCP connections (only a master listens)."""
        try:
            with socket.create_connection((HOST, self.port), timeout=0.25):
                return True
        except OSError:
            return False

    def wait_serving(self, timeout: float = START_TIMEOUT) -> float:
        """Poll until the port accepts; return the seconds it took. Fail fast if it died."""
        return poll(self.is_serving, timeout=timeout,
                    what=f"{self.name} serving on port {self.port}",
                    give_up=lambda: not self.alive, context=self.log_tail)[1]

    def wait_log(self, pattern: str, timeout: float = START_TIMEOUT, since: int = 0) -> None:
        """Poll the log (after ``since``, a length of its text) until the regex ``pattern``
        appears (a log line has no event to wait on); fails with the log tail at the
        deadline, or at once if the process exits."""
        poll(lambda: re.search(pattern, self.log_text()[since:]), timeout=timeout,
             what=f"{self.name} logs {pattern!r}", interval=0.05,
             give_up=lambda: not self.alive, context=self.log_tail)

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to end on its own; return its exit code."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self} still running after {timeout}s\n"
                                 f"{self.log_tail()}") from None

    def send_signal(self, sig: int) -> None:
        """Send a signal without waiting (e.g. SIGTERM while timing the slave's takeover)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed or released by the broker itself."""
        if self.alive:
            self.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (graceful stop) and wait; a broker that ignores it fails the test."""
        self.send_signal(signal.SIGCONT)  # a paused broker cannot handle SIGTERM
        self.send_signal(signal.SIGTERM)
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self} ignored SIGTERM for {timeout}s\n"
                                 f"{self.log_tail()}") from None

    def pause(self) -> None:
        self.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.send_signal(signal.SIGCONT)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log_text().splitlines()[-lines:]
        return f"--- last {len(text)} log lines of {self.name} ({self.log_path}) ---\n" + "\n".join(
            text)


#: Factories with processes that may still run; the failure hook dumps their logs.
ACTIVE_FACTORIES: list[BrokerFactory] = []


class BrokerFactory:
    """Creates brokers under one temporary directory and kills every one of them at close()."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.brokers: list[BrokerProcess] = []
        self._counter = 0
        ACTIVE_FACTORIES.append(self)

    def data_dir(self, label: str = "data") -> Path:
        path = self.base_dir / label
        path.mkdir(parents=True, exist_ok=True)
        return path

    def new(
        self,
        *,
        data_dir: Path | None = None,
        name: str | None = None,
        group: str = "default",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> BrokerProcess:
        """A broker object, not yet started (so several can be started together)."""
        self._counter += 1
        name = name or f"broker{self._counter}"
        broker = BrokerProcess(
            data_dir=data_dir or self.data_dir(f"data-{name}"),
            log_path=self.base_dir / f"{name}-{self._counter}.log",
            name=name,
            group=group,
            port=port,
            env=env,
            extra_args=extra_args,
        )
        self.brokers.append(broker)
        return broker

    def start(self, *, wait: bool = True, **kwargs: object) -> BrokerProcess:
        """Start one broker (by default waiting until it serves, i.e. it is master)."""
        broker = self.new(**kwargs).start()  # type: ignore[arg-type]
        if wait:
            broker.wait_serving()
        return broker

    def close(self) -> None:
        for broker in self.brokers:
            with contextlib.suppress(Exception):
                broker.kill()
        if self in ACTIVE_FACTORIES:
            ACTIVE_FACTORIES.remove(self)

    def dump_logs(self) -> str:
        return "\n".join(b.log_tail() for b in self.brokers if b.proc is not None)


@atexit.register
def _kill_leftovers() -> None:
    """Last resort if the run ends without fixture teardown (e.g. an internal error)."""
    for factory in list(ACTIVE_FACTORIES):
        factory.close()


def wait_one_serving(brokers: Iterable[BrokerProcess], timeout: float = START_TIMEOUT,
                     ) -> tuple[BrokerProcess, float]:
    """Poll until one of `brokers` serves; return it and the seconds it took."""
    brokers = list(brokers)
    return poll(lambda: next((b for b in brokers if b.is_serving()), None), timeout=timeout,
                what=f"one of {[b.name for b in brokers]} serving", interval=0.01,
                give_up=lambda: not any(b.alive for b in brokers),
                context=lambda: "\n".join(b.log_tail() for b in brokers))


#: Slaves of a pair poll the lock this often in tests (the default 0.5 s is also fine;
#: the tests measure the broker, not the poll period).
PAIR_LOCK_POLL = "0.1"


def start_pair(factory: BrokerFactory, names: tuple[str, str] = ("node-a", "node-b"),
               env: Mapping[str, str] | None = None,
               store_args: list[str] | None = None,
               extra_args: Sequence[str] = ()) -> tuple[BrokerProcess, BrokerProcess]:
    """Two brokers of one group, started together: on ONE data dir (embedded SQLite +
    file lock), or with ``store_args`` (``--store``/``--locker`` of a shared server,
    see ``broker_fixtures.store_args``); returns (master, slave). ``extra_args`` go to
    both (a ``--config``)."""
    env = {"AMQLITE_LOCK_POLL_INTERVAL": PAIR_LOCK_POLL, **(env or {})}
    if store_args:
        args = [*store_args, *extra_args]
        first = factory.new(name=names[0], env=env, extra_args=args).start()
        second = factory.new(name=names[1], env=env, extra_args=args).start()
    else:
        shared = factory.data_dir("shared")
        first = factory.new(data_dir=shared, name=names[0], env=env,
                            extra_args=extra_args).start()
        second = factory.new(data_dir=shared, name=names[1], env=env,
                             extra_args=extra_args).start()
    master, _ = wait_one_serving([first, second])
    return master, (second if master is first else first)


def never_serves(broker: BrokerProcess, duration: float) -> bool:
    """True if `broker` stays alive and keeps its port closed for `duration` seconds."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        if broker.is_serving() or not broker.alive:
            return False
        time.sleep(0.05)
    return True


def password_hash(password: str) -> str:
    """The users-file hash exactly as an operator makes it: `amqlite passwd`."""
    out = subprocess.run([*amqlite_command(), "passwd", "--password", password], check=True,
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    return out.stdout.strip().splitlines()[-1]
