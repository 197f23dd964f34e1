"""A PostgreSQL primary with a streaming standby, for the replication tests (issue 22):
the primary is ``tests.helpers.servers.PostgresServer`` with WAL senders; the standby is
``pg_basebackup -R`` of it, started on its own port, streaming under the name
``STANDBY_NAME`` (its ``cluster_name``, which its WAL receiver gives the primary as
``application_name``). Synchronous or not is the primary's ``synchronous_standby_names``.

Everything waits by polling with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

from tests.helpers.poll import poll
from tests.helpers.servers import STARTUP_TIMEOUT, PostgresServer, _pg_bin

#: The standby's name as the primary's pg_stat_replication shows it.
STANDBY_NAME = "standby1"
#: Replication settings of the primary (PostgreSQL 15/16 defaults would do for most;
#: written out so the test does not depend on them).
PRIMARY_CONF = ("\nwal_level = replica\nmax_wal_senders = 5\nmax_replication_slots = 5\n"
                "wal_keep_size = 64MB\nhot_standby = on\n")


class StandbyServer(PostgresServer):
    """A standby made from a running primary with ``pg_basebackup -R``."""

    def __init__(self, primary: PostgresServer) -> None:
        super().__init__()
        self.primary = primary

    def init(self) -> None:
        self.sockdir.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres", "postgres")
            shutil.chown(self.sockdir, "postgres", "postgres")
        self._run([_pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port),
                   "-U", self.primary.user, "-D", str(self.datadir), "-R", "-X", "stream",
                   "--checkpoint=fast"])
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(f"\nport = {self.port}\nunix_socket_directories = '{self.sockdir}'\n"
                    f"cluster_name = '{STANDBY_NAME}'\n")


class ReplicatedPostgres:
    """A primary and a streaming standby on loopback; ``primary.url()`` is the store."""

    def __init__(self) -> None:
        self.primary = PostgresServer()
        self.standby = StandbyServer(self.primary)

    def start(self) -> None:
        self.primary.init()
        with open(self.primary.datadir / "postgresql.conf", "a") as f:
            f.write(PRIMARY_CONF)
        self.primary.start()
        self.standby.init()
        self.standby.start()
        self.wait_streaming()

    def cleanup(self) -> None:
        self.standby.cleanup()
        self.primary.cleanup()

    # -- the primary's view ---------------------------------------------------------------
    def replication(self) -> dict[str, str]:
        """application_name -> "state/sync_state" of every WAL sender of the primary."""
        out = self.primary.psql("SELECT application_name, state || '/' || sync_state "
                                "FROM pg_stat_replication")
        return dict(line.split("|") for line in out.splitlines() if line)

    def wait_streaming(self, sync_state: str | None = None) -> None:
        """Until the standby streams (with this sync_state, when given)."""
        def ready() -> bool:
            state = self.replication().get(STANDBY_NAME, "")
            return state.startswith("streaming/") and (
                sync_state is None or state.endswith("/" + sync_state))
        poll(ready, timeout=STARTUP_TIMEOUT, interval=0.1,
             what=f"{STANDBY_NAME} streaming ({sync_state or 'any'})",
             context=lambda: str(self.replication()))

    def wait_gone(self) -> None:
        poll(lambda: STANDBY_NAME not in self.replication(), timeout=STARTUP_TIMEOUT,
             interval=0.1, what=f"{STANDBY_NAME} gone from pg_stat_replication")

    def set_synchronous(self, names: str) -> None:
        """The primary's synchronous_standby_names ('' for asynchronous), reloaded."""
        quoted = names.replace("'", "''")
        self.primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{quoted}'")
        self.primary.psql("SELECT pg_reload_conf()")
        poll(lambda: self.primary.psql("SHOW synchronous_standby_names") == names,
             timeout=STARTUP_TIMEOUT, interval=0.05, what="synchronous_standby_names applied")

    def stop_standby(self, mode: str = "immediate") -> None:
        self.standby.stop(mode)
        self.wait_gone()

    def start_standby(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.standby.start()
        self.wait_streaming()


@contextlib.contextmanager
def replicated_postgres() -> Iterator[ReplicatedPostgres]:
    """A throwaway primary + standby, removed afterwards (also after a failure)."""
    pair = ReplicatedPostgres()
    try:
        pair.start()
        yield pair
    finally:
        pair.cleanup()

