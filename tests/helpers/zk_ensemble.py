"""A throwaway three-server ZooKeeper ensemble on loopback, from Debian's package.

Each server is a ``QuorumPeerMain`` JVM with its own data directory, ``myid`` and
``zoo.cfg`` listing every server as ``server.N=127.0.0.1:QUORUM:ELECTION`` (all
ports distinct and free), a short tick (200 ms, as the standalone test server) so
that an election and a session timeout take seconds, not the production tens of
seconds. Which server leads is read with the ``srvr`` four-letter command
(``Mode: leader``/``follower``; a server without a quorum answers that it is not
serving). Every server runs in its own process group; ``cleanup()`` (the fixture's
finalizer) ends them all and removes their files.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.poll import poll
from tests.helpers.servers import (
    STARTUP_TIMEOUT,
    ZOOKEEPER_CLASSPATH,
    ZOOKEEPER_LOG_TIME,
    free_port,
    zookeeper_tmpdir,
)

#: A logging backend for the JVM (Debian's zookeeper.jar names none, so without it the
#: server says nothing): slf4j-simple writes INFO and above to stderr, i.e. the log file.
SLF4J_SIMPLE = "/usr/share/java/slf4j-simple.jar"
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"

_MODE = re.compile(r"^Mode: (\w+)", re.MULTILINE)


def four_letter(port: int, command: str, timeout: float = 1.0) -> str | None:
    """A four-letter command's answer from 127.0.0.1:``port``; None if nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(command.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


@dataclass
class EnsembleMember:
    """One server of the ensemble: its id, ports, files and process."""

    myid: int
    client_port: int
    quorum_port: int
    election_port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def cfg(self) -> Path:
        return self.directory / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def mode(self) -> str | None:
        """``leader``, ``follower`` (serving in a quorum), or None (down, electing, or
        not in a quorum)."""
        answer = four_letter(self.client_port, "srvr")
        match = _MODE.search(answer or "")
        return match.group(1) if match else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            text = []
        return f"--- last {len(text)} lines of ZooKeeper server {self.myid} " \
               f"({self.log_path}) ---\n" + "\n".join(text)


class ZooKeeperEnsemble:
    """``size`` ZooKeeper servers of one quorum on 127.0.0.1."""

    #: ms; sessions are granted 2x-``MAX_SESSION_TICKS``x this.
    TICK_MS = 200
    #: Ticks a follower has to connect to a new leader and sync (2 s).
    INIT_LIMIT = 10
    #: Ticks a follower may be out of touch with the leader (1 s).
    SYNC_LIMIT = 5
    #: Longest session a client is granted, in ticks (20 s, ZooKeeper's default ratio).
    MAX_SESSION_TICKS = 100

    def __init__(self, size: int = 3) -> None:
        self.tmp = zookeeper_tmpdir("amqlite-zkens-")
        ports = self._distinct_ports(3 * size)
        self.members = [
            EnsembleMember(myid=i + 1, client_port=ports[3 * i], quorum_port=ports[3 * i + 1],
                           election_port=ports[3 * i + 2], directory=self.tmp / f"zk{i + 1}")
            for i in range(size)
        ]
        servers = "".join(f"server.{m.myid}=127.0.0.1:{m.quorum_port}:{m.election_port}\n"
                          for m in self.members)
        for m in self.members:
            (m.directory / "data").mkdir(parents=True)
            (m.directory / "data" / "myid").write_text(f"{m.myid}\n")
            m.cfg.write_text(
                f"tickTime={self.TICK_MS}\ninitLimit={self.INIT_LIMIT}\n"
                f"syncLimit={self.SYNC_LIMIT}\ndataDir={m.directory / 'data'}\n"
                f"clientPort={m.client_port}\nclientPortAddress=127.0.0.1\n"
                "admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok,stat,mntr\n"
                f"minSessionTimeout={2 * self.TICK_MS}\n"
                f"maxSessionTimeout={self.MAX_SESSION_TICKS * self.TICK_MS}\n"
                f"{servers}"
            )

    @staticmethod
    def _distinct_ports(n: int) -> list[int]:
        ports: list[int] = []
        while len(ports) < n:
            port = free_port()
            if port not in ports:
                ports.append(port)
        return ports

    @property
    def hosts(self) -> str:
        """kazoo's (and a zk:// URL's) host list: every server."""
        return ",".join(f"127.0.0.1:{m.client_port}" for m in self.members)

    def start(self) -> None:
        """Start every server and wait until they form one quorum (one leader, the
        others following)."""
        if not Path(ZOOKEEPER_JAR).exists():
            raise RuntimeError("ZooKeeper not installed: run scripts/install-test-deps")
        for m in self.members:
            self.start_member(m)
        self.wait_quorum(self.members)

    def start_member(self, m: EnsembleMember) -> None:
        classpath = ZOOKEEPER_CLASSPATH
        if Path(SLF4J_SIMPLE).exists():
            classpath += f":{SLF4J_SIMPLE}"
        with open(m.log_path, "ab") as log:
            m.proc = subprocess.Popen(
                ["java", "-Xmx192m", ZOOKEEPER_LOG_TIME, "-cp", classpath,
                 "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(m.cfg)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def modes(self, members: list[EnsembleMember] | None = None) -> dict[int, str | None]:
        return {m.myid: m.mode() for m in (members or self.members)}

    def wait_quorum(self, members: list[EnsembleMember], timeout: float = STARTUP_TIMEOUT,
                    ) -> tuple[EnsembleMember, float]:
        """Poll until exactly one of ``members`` leads and all the others follow; return
        the leader and the seconds it took. Fails at once if one of them exited."""
        def settled() -> EnsembleMember | None:
            modes = self.modes(members)
            leaders = [m for m in members if modes[m.myid] == "leader"]
            if len(leaders) == 1 and all(v in ("leader", "follower") for v in modes.values()):
                return leaders[0]
            return None

        leader, took = poll(settled, timeout=timeout, interval=0.02,
                            what=f"servers {[m.myid for m in members]} form a quorum",
                            give_up=lambda: not all(m.alive for m in members),
                            context=lambda: f"modes {self.modes(members)}\n{self.log_tails()}")
        assert leader is not None
        return leader, took

    def leader(self) -> EnsembleMember:
        leader, _ = self.wait_quorum([m for m in self.members if m.alive])
        return leader

    def kill(self, m: EnsembleMember) -> None:
        """SIGKILL, as a crash: the server closes nothing and tells no one."""
        if m.proc is not None and m.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(10)

    def stop_member(self, m: EnsembleMember) -> None:
        if m.proc is None:
            return
        if m.proc.poll() is None:
            m.proc.terminate()
            try:
                m.proc.wait(10)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait()
        m.proc = None

    def cleanup(self) -> None:
        for m in self.members:
            self.stop_member(m)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def log_tails(self, lines: int = 40) -> str:
        return "\n".join(m.log_tail(lines) for m in self.members)


@contextlib.contextmanager
def running_ensemble(size: int = 3) -> Iterator[ZooKeeperEnsemble]:
    """An ensemble of its own, stopped and removed afterwards (also after a failure)."""
    ensemble = ZooKeeperEnsemble(size)
    try:
        ensemble.start()
        yield ensemble
    finally:
        ensemble.cleanup()
