"""Throwaway real servers for integration tests: PostgreSQL and ZooKeeper.

Each binds to 127.0.0.1 on a free port, lives in a temporary directory and is
stopped by its fixture (and killed with its process group if a test run dies).
PostgreSQL refuses to run as root, so when the tests run as root its files
belong to, and its processes run as, the ``postgres`` system user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from amqlite.listen import PICK_FLOOR, ephemeral_range, pick_ports
from tests.helpers.poll import poll

if TYPE_CHECKING:
    from kazoo.client import KazooClient

#: Where Debian's packages put things; `scripts/install-test-deps` installs them.
ZOOKEEPER_CLASSPATH = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"
PG_BIN_CANDIDATES = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")

#: How long a server may take to come up before the fixture gives up.
STARTUP_TIMEOUT = 30.0
#: Memory-backed, where the machine has it: ZooKeeper's data directories (below).
TMPFS = Path("/dev/shm")
#: slf4j-simple's timestamps in ZooKeeper's logs (a stalled server shows when it stalled).
ZOOKEEPER_LOG_TIME = "-Dorg.slf4j.simpleLogger.showDateTime=true"


def zookeeper_tmpdir(prefix: str) -> Path:
    """A directory for a test ZooKeeper's data, on tmpfs where there is one. ZooKeeper
    fsyncs each transaction and each snapshot, and on a disk the rest of the suite writes
    to (a PostgreSQL database per test) one such fsync stalled a new ensemble's leader for
    the whole start timeout; what these tests test is amqlite when ZooKeeper's servers or
    sessions go, not ZooKeeper's disk."""
    where = TMPFS if TMPFS.is_dir() and os.access(TMPFS, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=where))


def worker_ports() -> tuple[int, int] | None:
    """This test process's slice of ``pick_ports``' range when pytest-xdist runs the
    suite in several (``scripts/test``: two): a port one worker picked is free until its
    server binds it (a second, or the seconds a restarted broker is down), and the other
    worker must not pick it meanwhile. None when one process runs the tests."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or workers < 2:
        return None
    floor, ceiling = PICK_FLOOR, ephemeral_range()[0]
    size = (ceiling - floor) // workers
    index = int(worker.removeprefix("gw"))
    return floor + index * size, floor + (index + 1) * size


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` loopback ports free now, outside the ephemeral range (``pick_ports``),
    in this worker's slice."""
    return pick_ports(count, host, span=worker_ports())


def free_port() -> int:
    """A loopback port free now, outside the ephemeral range (see ``pick_ports``)."""
    return free_ports(1)[0]


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(port: int, timeout: float = STARTUP_TIMEOUT, host: str = "127.0.0.1") -> None:
    poll(lambda: _accepts(host, port), timeout=timeout,
         what=f"something listens on {host}:{port}", interval=0.05)


def _pg_bin(name: str) -> str:
    for d in PG_BIN_CANDIDATES:
        p = Path(d) / name
        if p.exists():
            return str(p)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: run scripts/install-test-deps")
    return found


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


class PostgresServer:
    """A PostgreSQL cluster made with initdb and driven with pg_ctl."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="amqlite-pg-"))
        self.datadir = self.tmp / "data"
        self.sockdir = self.tmp / "sock"
        self.logfile = self.tmp / "postgres.log"
        self.port = free_port()
        self.user = "postgres"
        self._db_counter = 0

    def _run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(_as_postgres(cmd), check=True, capture_output=True, text=True, **kw)

    def init(self) -> None:
        self.sockdir.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres", "postgres")
            shutil.chown(self.sockdir, "postgres", "postgres")
        self._run(
            [
                _pg_bin("initdb"),
                "-D", str(self.datadir),
                "-U", self.user,
                "--auth=trust",
                "--no-instructions",
                "-E", "UTF8",
            ]
        )
        conf = self.datadir / "postgresql.conf"
        with open(conf, "a") as f:
            f.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.sockdir}'\n"
                "max_connections = 200\nfsync = on\nsynchronous_commit = on\n"
                "shared_buffers = 128MB\nlog_min_messages = warning\n"
            )

    def start(self) -> None:
        self._run(
            [_pg_bin("pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile),
             "-w", "-t", str(int(STARTUP_TIMEOUT)), "start"]
        )
        wait_for_port(self.port)

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run([_pg_bin("pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"])

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def postmaster_pid(self) -> int | None:
        """The server's main process (its backends are its children), for CPU accounting."""
        try:
            return int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        out = subprocess.run(
            ["psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
             "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", dbname, "-c", sql],
            check=True, capture_output=True, text=True,
        )
        return out.stdout.strip()

    def create_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        self._db_counter += 1
        name = f"amqtest_{os.getpid()}_{self._db_counter}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL of its own, removed afterwards (also after a failure)."""
    server = PostgresServer()
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


class ZooKeeperServer:
    """A standalone ZooKeeper from Debian's package, with a short tick so that
    session expiry in tests takes seconds, not the production 18-40 s."""

    #: ZooKeeper negotiates session timeouts within 2x-20x tickTime.
    TICK_MS = 200

    def __init__(self) -> None:
        self.tmp = zookeeper_tmpdir("amqlite-zk-")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        cfg = self.tmp / "zoo.cfg"
        cfg.write_text(
            f"tickTime={self.TICK_MS}\ndataDir={self.tmp / 'data'}\n"
            f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok,stat,cons\n"
            f"minSessionTimeout={2 * self.TICK_MS}\nmaxSessionTimeout={100 * self.TICK_MS}\n"
        )
        self.cfg = cfg

    def start(self) -> None:
        if not Path("/usr/share/java/zookeeper.jar").exists():
            raise RuntimeError("ZooKeeper not installed: run scripts/install-test-deps")
        log = open(self.tmp / "zookeeper.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", ZOOKEEPER_LOG_TIME, "-cp", ZOOKEEPER_CLASSPATH,
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(self.cfg)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        self._wait_serving()

    def _serves(self) -> bool:
        """``srvr`` names the server's mode once it serves: its database is loaded.
        ``ruok`` says imok before that, while a client's connection would be left
        hanging (ZOOKEEPER-5051: see tests/cluster/test_zk_ha.py's zk_gate)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"srvr")
                answer = b""
                while chunk := s.recv(4096):
                    answer += chunk
                return b"Mode:" in answer
        except OSError:
            return False

    def _wait_serving(self) -> None:
        poll(self._serves, timeout=STARTUP_TIMEOUT, what="ZooKeeper serves (srvr)",
             interval=0.1, give_up=lambda: self.proc is not None and self.proc.poll() is not None,
             context=lambda: f"see {self.tmp / 'zookeeper.log'}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @contextlib.contextmanager
    def admin(self) -> Iterator[KazooClient]:
        """A kazoo client of the test's own, to look at or change znodes directly."""
        from kazoo.client import KazooClient

        client = KazooClient(hosts=self.hosts, timeout=10.0)
        client.start(timeout=30)
        try:
            yield client
        finally:
            client.stop()
            client.close()
