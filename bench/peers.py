"""The brokers users would pick instead of amqlite, run on loopback for a comparison.

ActiveMQ Classic (Debian's ``activemq``) with a JDBC persistence adapter on a
PostgreSQL we start, its STOMP connector on a free 127.0.0.1 port and its
default database locker (so two of them make a JDBC master/slave pair); and
RabbitMQ (Debian's ``rabbitmq-server``) with the ``rabbitmq_stomp`` plugin, a
private node name, epmd and data directories: one node for a classic queue, or
three joined into a cluster for a quorum queue (bench/rabbitmq.py). Each runs as
its own process group in a temporary directory, started directly (no systemd),
and is stopped and removed by ``stop()`` -- also when a benchmark fails.
``bench/install-peers`` installs the packages.

    python bench/peers.py activemq          # start one, print its STOMP port, stop on Enter
    python bench/peers.py rabbitmq-quorum   # (or rabbitmq, postgres|sqlite: amqlite,
                                            #  activemq-kahadb)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import (  # noqa: E402  (re-exported: the bench scripts import them here)
    START_TIMEOUT,
    STOP_TIMEOUT,
    PeerProcess,
    Stoppable,
    dpkg_version,
    port_open,
    thread_cpu_seconds,
    tree_cpu_seconds,
    tree_pids,
    tree_rss_bytes,
)
from bench.rabbitmq import RabbitCluster, RabbitMQ  # noqa: E402
from tests.helpers.servers import PostgresServer, free_port  # noqa: E402

__all__ = ["START_TIMEOUT", "STOP_TIMEOUT", "PeerProcess", "PeerSet", "RabbitCluster",
           "RabbitMQ", "jdbc_url", "port_open", "thread_cpu_seconds", "tree_cpu_seconds",
           "tree_pids", "tree_rss_bytes"]

#: Debian's activemq package layout (``dpkg -L activemq``).
ACTIVEMQ_HOME = Path("/usr/share/activemq")
ACTIVEMQ_JAR = ACTIVEMQ_HOME / "bin" / "activemq.jar"
#: Debian's libpostgresql-jdbc-java and libcommons-dbcp2-java (upstream ActiveMQ
#: ships commons-dbcp2 in lib/optional for its JDBC examples; Debian does not).
JDBC_JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/commons-dbcp2.jar",
             "/usr/share/java/commons-pool2.jar")
#: Debian's /usr/share/activemq/activemq-options: ``-Xms512M -Xmx512M``.
ACTIVEMQ_HEAP = "512M"
#: JDBC connections in ActiveMQ's pool: one per producer of W1 (50), as its
#: JDBC performance example sizes the pool to the clients.
ACTIVEMQ_JDBC_POOL = 60

#: The JVM flags Debian's /usr/bin/activemq passes to Java > 8.
_JAVA_MODULE_FLAGS = [
    "--add-reads=java.xml=java.logging",
    *[f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
        "java.security", "java.net", "java.lang", "java.util", "java.util.concurrent",
        "java.util.concurrent.atomic")],
    "--add-opens=java.naming/javax.naming.spi=ALL-UNNAMED",
    "--add-opens=java.rmi/sun.rmi.transport.tcp=ALL-UNNAMED",
]

_ACTIVEMQ_XML = """\
<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans.xsd
    http://activemq.apache.org/schema/core
    http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="{name}"
          useJmx="false" persistent="true" dataDirectory="{data}">
    <persistenceAdapter>
{adapter}
    </persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp"
        uri="stomp://127.0.0.1:{port}?transport.tcpNoDelay=true"/>
    </transportConnectors>
  </broker>
{datasource}
</beans>
"""

_JDBC_ADAPTER = ('      <jdbcPersistenceAdapter dataSource="#pg-ds" '
                 'createTablesOnStartup="true"/>')
_KAHADB_ADAPTER = '      <kahaDB directory="{data}/kahadb"/>'

_DATASOURCE = """\
  <bean id="pg-ds" class="org.apache.commons.dbcp2.BasicDataSource" destroy-method="close">
    <property name="driverClassName" value="org.postgresql.Driver"/>
    <property name="url" value="{url}"/>
    <property name="username" value="{user}"/>
    <property name="password" value=""/>
    <property name="maxTotal" value="{pool}"/>
    <property name="poolPreparedStatements" value="true"/>
  </bean>
"""

#: Debian's ActiveMQ logs through log4j 1.2 (liblog4j1.2-java); found on the classpath.
_LOG4J = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=%d{HH:mm:ss,SSS} %-5p [%t] %c{1} - %m%n
"""


def jdbc_url(pg: PostgresServer, sqlalchemy_url: str) -> str:
    """The JDBC form of a database URL that tests.helpers.servers hands out."""
    return f"jdbc:postgresql://127.0.0.1:{pg.port}/{sqlalchemy_url.rsplit('/', 1)[1]}"


class ActiveMQ(PeerProcess):
    """One ActiveMQ Classic broker; ``store`` is ``jdbc`` (needs ``jdbc``) or ``kahadb``."""

    #: DefaultDatabaseLocker's INFO line before it blocks in SELECT ... FOR UPDATE.
    STANDBY_LOG_LINE = b"Attempting to acquire the exclusive lock"

    def __init__(self, tmp: Path, name: str, store: str = "jdbc", jdbc: str = "",
                 pg_user: str = "postgres", stomp_port: int | None = None) -> None:
        super().__init__(tmp, name)
        if not ACTIVEMQ_JAR.exists():
            raise RuntimeError("ActiveMQ is not installed: run bench/install-peers")
        self.port = stomp_port or free_port()
        self.base = tmp / name
        conf = self.base / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        data = self.base / "data"
        if store == "jdbc":
            adapter = _JDBC_ADAPTER
            datasource = _DATASOURCE.format(url=escape(jdbc), user=escape(pg_user),
                                            pool=ACTIVEMQ_JDBC_POOL)
        else:
            adapter, datasource = _KAHADB_ADAPTER.format(data=data), ""
        self.config = {"broker": "activemq", "version": dpkg_version("activemq"),
                       "store": "jdbc-postgresql" if store == "jdbc" else "kahadb",
                       "locker": "DefaultDatabaseLocker" if store == "jdbc" else "kahadb lock",
                       "heap": ACTIVEMQ_HEAP}
        (conf / "activemq.xml").write_text(_ACTIVEMQ_XML.format(
            name=name, data=data, adapter=adapter, datasource=datasource, port=self.port))
        (conf / "log4j.properties").write_text(_LOG4J)

    def start(self) -> None:
        conf = self.base / "conf"
        classpath = ":".join([str(conf), *JDBC_JARS])
        cmd = ["java", f"-Xms{ACTIVEMQ_HEAP}", f"-Xmx{ACTIVEMQ_HEAP}",
               "-Dorg.apache.activemq.UseDedicatedTaskRunner=true", *_JAVA_MODULE_FLAGS,
               f"-Dactivemq.classpath={classpath}", f"-Dactivemq.home={ACTIVEMQ_HOME}",
               f"-Dactivemq.base={self.base}", f"-Dactivemq.conf={conf}",
               f"-Dactivemq.data={self.base / 'data'}",
               "-jar", str(ACTIVEMQ_JAR), "start", f"xbean:file:{conf / 'activemq.xml'}"]
        self._spawn(cmd, cwd=self.base)


class Amqlite(PeerProcess):
    """One amqlite node (``python -m cli start``), so the runner treats all brokers alike."""

    #: amqlite/node.py logs this at INFO when a slave starts polling the lock.
    STANDBY_LOG_LINE = b"waiting for the lock"

    def __init__(self, tmp: Path, name: str, store: str, url: str = "",
                 group: str = "bench", log_level: str = "WARNING") -> None:
        super().__init__(tmp, name)
        self.port = free_port()
        if store == "postgres":
            self.store_args = ["--store", url, "--locker", url]
            self.config = {"broker": "amqlite", "store": "postgresql",
                           "locker": "postgresql advisory lock"}
        else:
            self.store_args = ["--data-dir", str(tmp / f"{group}-data")]
            self.config = {"broker": "amqlite", "store": "sqlite", "locker": "file"}
        self.config["version"] = _git_version()
        self.group, self.log_level = group, log_level
        #: The management API (metrics scrapes: load.py --scrape-interval).
        self.http_port = free_port()
        self.config["http"] = f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        # AMQLITE_BENCH_PROFILE=DIR: every thread of the node under cProfile (bench only).
        profile = os.environ.get("AMQLITE_BENCH_PROFILE")
        runner = ([str(ROOT / "bench" / "profile_node.py"), profile] if profile
                  else ["-m", "cli"])
        self._spawn([sys.executable, *runner, "start", "--group", self.group,
                     "--name", self.name, "--bind", f"127.0.0.1:{self.port}",
                     "--log-level", self.log_level, "--http", f"127.0.0.1:{self.http_port}",
                     *self.store_args], cwd=ROOT)


def _git_version() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


#: What ``--spawn`` accepts: amqlite on PostgreSQL or SQLite (the names load.py
#: always had), ActiveMQ on JDBC/PostgreSQL or KahaDB, RabbitMQ on one node (a classic
#: queue) or three (a quorum queue: load.py adds its ``x-queue-type`` header).
SPAWN_KINDS = ("postgres", "sqlite", "activemq", "activemq-kahadb", "rabbitmq",
               "rabbitmq-quorum")


class PeerSet:
    """Whatever a benchmark started, stopped in reverse order by ``close()``."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="amqlite-peers-"))
        self.pg: PostgresServer | None = None
        self.procs: list[Stoppable] = []
        #: The RabbitMQ cluster started here, if any (its queues can be asked about).
        self.cluster: RabbitCluster | None = None
        #: SIGTERM's handler before ``__enter__`` (restored by ``__exit__``).
        self._sigterm: Any = None

    def postgres(self) -> PostgresServer:
        if self.pg is None:
            self.pg = PostgresServer()
            self.pg.init()
            self.pg.start()
        return self.pg

    def activemq(self, name: str = "amq", store: str = "jdbc", jdbc: str | None = None,
                 start: bool = True) -> ActiveMQ:
        if store == "jdbc" and jdbc is None:
            pg = self.postgres()
            jdbc = jdbc_url(pg, pg.create_database())
        broker = ActiveMQ(self.tmp, name, store=store, jdbc=jdbc or "")
        self.procs.append(broker)
        if start:
            broker.start()
            broker.wait_port(broker.port)
        return broker

    def amqlite(self, store: str = "postgres", name: str = "amqlite", url: str | None = None,
                log_level: str = "WARNING", start: bool = True) -> Amqlite:
        if store == "postgres" and url is None:
            url = self.postgres().create_database()
        broker = Amqlite(self.tmp, name, store, url or "", log_level=log_level)
        self.procs.append(broker)
        if start:
            broker.start()
            broker.wait_port(broker.port)
        return broker

    def spawn(self, kind: str) -> Amqlite | ActiveMQ | RabbitMQ | RabbitCluster:
        """A started broker of one of SPAWN_KINDS."""
        if kind in ("postgres", "sqlite"):
            return self.amqlite(kind)
        if kind == "activemq":
            return self.activemq()
        if kind == "activemq-kahadb":
            return self.activemq(store="kahadb")
        if kind == "rabbitmq":
            return self.rabbitmq()
        if kind == "rabbitmq-quorum":
            return self.rabbitmq_cluster()
        raise ValueError(f"unknown broker kind {kind!r}")

    def target(self, spawn: str | None,
               port: int | None) -> tuple[int, tuple[int, ...], dict[str, Any]]:
        """The broker a command measures: one of SPAWN_KINDS started here, or the
        one already listening on ``port``. Returns its port, the pids of its
        processes (one per cluster node; none when not ours) and its configuration
        (empty when not ours)."""
        if not spawn:
            if port is None:
                raise ValueError("give a broker kind to spawn or the port of a running one")
            return port, (), {}
        broker = self.spawn(spawn)
        pids = broker.pids if isinstance(broker, RabbitCluster) else (broker.pid,)
        return broker.port, pids, broker.config

    def rabbitmq(self) -> RabbitMQ:
        broker = RabbitMQ(self.tmp)
        self.procs.append(broker)
        broker.start()
        broker.wait_port(broker.port)
        return broker

    def rabbitmq_cluster(self) -> RabbitCluster:
        """Three RabbitMQ nodes joined into one cluster (bench/rabbitmq.py)."""
        cluster = RabbitCluster(self.tmp)
        self.procs.append(cluster)
        self.cluster = cluster
        cluster.start()
        return cluster

    def close(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(Exception):
                p.stop()
        if self.pg is not None:
            self.pg.cleanup()
        if os.environ.get("AMQLITE_BENCH_KEEP"):  # logs for a post-mortem
            print(f"kept {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> PeerSet:
        # A bench stopped with SIGTERM (kill, timeout) stops what it started: the
        # signal becomes SystemExit, so ``__exit__`` runs. Python's default would end
        # the process at once and leave RabbitMQ's or ActiveMQ's nodes running.
        if threading.current_thread() is threading.main_thread():
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Start one broker on loopback, print its STOMP "
                                             "port, stop it on Enter.")
    ap.add_argument("kind", nargs="?", default="activemq", choices=SPAWN_KINDS)
    kind = ap.parse_args(argv).kind
    with PeerSet() as peers:
        broker = peers.spawn(kind)
        print(f"{kind} STOMP on 127.0.0.1:{broker.port} (log {broker.log}); Enter stops it")
        with contextlib.suppress(EOFError):
            input()
    return 0


if __name__ == "__main__":
    sys.exit(main())
