"""RabbitMQ for the side-by-side runs: one node (a classic queue) or a cluster of three
nodes on loopback (a quorum queue replicated on all three), from Debian's
``rabbitmq-server``, started directly (no systemd) in a temporary directory.

Every node has its own node name, AMQP, STOMP and Erlang distribution ports, data and
log directories and an ``enabled_plugins`` file with ``rabbitmq_stomp``; every listener,
epmd included, is bound to 127.0.0.1. A cluster's nodes share one epmd and one Erlang
cookie, and nodes 2 and 3 join node 1 with ``rabbitmqctl join_cluster``, the procedure of
RabbitMQ's clustering guide. ``bench/peers.py`` (``PeerSet``) starts and stops them.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

from bench.procs import START_TIMEOUT, STOP_TIMEOUT, PeerProcess, dpkg_version
from tests.helpers.servers import free_port

#: Debian's rabbitmq-server installs the Erlang release here. The CLI is called
#: directly: /usr/sbin/rabbitmqctl would switch to the rabbitmq user and its HOME,
#: whose cookie is not the bench's.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
RABBITMQ_SERVER = RABBITMQ_BIN / "rabbitmq-server"
RABBITMQCTL = RABBITMQ_BIN / "rabbitmqctl"
EPMD = "epmd"
#: RabbitMQ's own example of a cluster with quorum queues: three nodes, so one may
#: fail and a majority (two) still confirms every write.
CLUSTER_SIZE = 3
#: Erlang's distribution (node to node, and rabbitmqctl to a node) on loopback only:
#: by default it listens on every interface.
_DIST_LOOPBACK = "-kernel inet_dist_use_interface {127,0,0,1}"


class RabbitMQ(PeerProcess):
    """One RabbitMQ node with the STOMP plugin, all on loopback. Alone it runs its
    own epmd and keeps the cookie Erlang makes; in a cluster (``epmd_port`` and
    ``cookie`` given) it uses the cluster's."""

    def __init__(self, tmp: Path, name: str = "rabbit", epmd_port: int | None = None,
                 cookie: str | None = None) -> None:
        super().__init__(tmp, name)
        if not RABBITMQ_SERVER.exists():
            raise RuntimeError("RabbitMQ is not installed: run bench/install-peers")
        self.port = free_port()
        self.amqp_port = free_port()
        self.dist_port = free_port()
        self.ctl_dist_port = free_port()
        self.own_epmd = epmd_port is None
        self.epmd_port = epmd_port or free_port()
        self.node = f"bench{os.getpid()}{name}@localhost"
        self.base = tmp / name
        self.base.mkdir(parents=True, exist_ok=True)
        if cookie is not None:
            path = self.base / ".erlang.cookie"
            path.write_text(cookie)
            path.chmod(0o400)  # Erlang refuses a cookie file others may read
        (self.base / "enabled_plugins").write_text("[rabbitmq_stomp].\n")
        (self.base / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
            f"stomp.listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "stomp.tcp_listen_options.nodelay = true\n"
            "loopback_users.guest = true\n")
        (self.base / "rabbitmq-env.conf").write_text("")
        self.epmd: PeerProcess | None = None
        self.config: dict[str, Any] = {
            "broker": "rabbitmq", "version": dpkg_version("rabbitmq-server"),
            "store": "classic durable queue, persistent messages",
            "erlang": dpkg_version("erlang-base")}

    def env(self) -> dict[str, str]:
        b = self.base
        return dict(
            os.environ, HOME=str(b), ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=_DIST_LOOPBACK,
            RABBITMQ_CTL_ERL_ARGS=_DIST_LOOPBACK,
            RABBITMQ_CTL_DIST_PORT_MIN=str(self.ctl_dist_port),
            RABBITMQ_CTL_DIST_PORT_MAX=str(self.ctl_dist_port),
            RABBITMQ_CONF_ENV_FILE=str(b / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(b / "rabbitmq"), RABBITMQ_MNESIA_BASE=str(b / "mnesia"),
            RABBITMQ_LOG_BASE=str(b / "log"), RABBITMQ_LOGS="-",
            RABBITMQ_ENABLED_PLUGINS_FILE=str(b / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(b / "rabbit.pid"),
        )

    def start(self) -> None:
        if self.own_epmd:
            self.epmd = start_epmd(self.tmp, f"{self.name}-epmd", self.epmd_port, self.env())
        self._spawn([str(RABBITMQ_SERVER)], env=self.env(), cwd=self.base)

    def ctl(self, *args: str, timeout: float = START_TIMEOUT) -> str:
        """``rabbitmqctl -n NODE ARGS`` with this node's cookie and epmd; its stdout.
        A failure raises RuntimeError with the CLI's last lines."""
        try:
            out = subprocess.run([str(RABBITMQCTL), "-n", self.node, *args], env=self.env(),
                                 capture_output=True, text=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: no answer in {timeout:.0f} s"
                               ) from exc
        if out.returncode != 0:
            tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-5:])
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.node} failed: {tail}")
        return out.stdout

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.epmd is not None:
                self.epmd.stop()


def start_epmd(tmp: Path, name: str, port: int, env: dict[str, str]) -> PeerProcess:
    """An epmd of our own on a free loopback port (never the machine's on 4369)."""
    epmd = PeerProcess(tmp, name)
    epmd._spawn([EPMD, "-port", str(port), "-address", "127.0.0.1"], env=env)
    epmd.wait_port(port, 10)
    return epmd


class RabbitCluster:
    """``size`` RabbitMQ nodes joined into one cluster. Clients connect to the first
    node's STOMP port, where a quorum queue declared by them gets its leader (RabbitMQ's
    default ``client-local`` placement); its followers are the other nodes."""

    def __init__(self, tmp: Path, name: str = "rabbitq", size: int = CLUSTER_SIZE) -> None:
        self.tmp, self.name = tmp, name
        self.epmd_port = free_port()
        cookie = secrets.token_hex(20)  # what makes them one cluster, and only them
        self.nodes = [RabbitMQ(tmp, f"{name}{i + 1}", self.epmd_port, cookie)
                      for i in range(size)]
        self.epmd: PeerProcess | None = None
        first = self.nodes[0]
        self.port, self.log = first.port, first.log
        self.config: dict[str, Any] = {
            **first.config, "store": "quorum queue (Raft), persistent messages",
            "nodes": size, "clients_on": "node 1 (the queue's leader)"}

    @property
    def pid(self) -> int:
        return self.nodes[0].pid

    @property
    def pids(self) -> tuple[int, ...]:
        """Every node's process group leader: the broker's CPU is all three's."""
        return tuple(n.pid for n in self.nodes)

    def start(self) -> None:
        """Boot every node (at once: it is the slow part), then join nodes 2.. to node 1
        and wait until the cluster reports all of them running."""
        first = self.nodes[0]
        self.epmd = start_epmd(self.tmp, f"{self.name}-epmd", self.epmd_port, first.env())
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_port(node.port)
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.node)
            node.ctl("start_app")
        first.ctl("await_online_nodes", str(len(self.nodes)), "--timeout",
                  str(int(START_TIMEOUT * 1000)))
        for node in self.nodes:
            node.wait_port(node.port)
        self.config["cluster"] = self.running_nodes()

    def running_nodes(self) -> list[str]:
        """The running nodes as node 1 sees them (``cluster_status``)."""
        status = json.loads(self.nodes[0].ctl("cluster_status", "--formatter", "json"))
        return sorted(status.get("running_nodes", []))

    def queue_members(self, queue: str) -> dict[str, Any]:
        """Type, leader and members of ``queue`` (``list_queues``), to show a run's
        queue was the replicated kind it claims."""
        out = self.nodes[0].ctl("list_queues", "--formatter", "json",
                                "name", "type", "leader", "members")
        for q in json.loads(out or "[]"):
            if q.get("name") == queue:
                return {k: q.get(k) for k in ("type", "leader", "members")}
        return {}

    def alive(self) -> bool:
        return all(n.alive() for n in self.nodes)

    def stop(self) -> None:
        """SIGTERM to every node at once (each shuts down in seconds; one after
        another would add up), SIGKILL what is left, then epmd."""
        for node in self.nodes:
            node.terminate()
        for node in self.nodes:
            node.wait_stopped(STOP_TIMEOUT)
        for node in self.nodes:
            node.stop()
        if self.epmd is not None:
            self.epmd.stop()
