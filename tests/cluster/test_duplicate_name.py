"""A second live node with a name its group already has is refused at start with one line,
exit 2 (issue 27: the slave never showed in ``cluster-list`` and ``amqlite stop`` stopped
the wrong node). A node restarted under its name after a crash is not refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.broker_proc import BrokerFactory, unique
from tests.helpers.cluster import cluster_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EXIT_USAGE = 2


@pytest.mark.parametrize("registry", ["store", "zookeeper"])
def test_a_second_node_with_a_live_name_is_refused(broker_factory: BrokerFactory,
                                                   tmp_path: Path, registry: str,
                                                   request: pytest.FixtureRequest) -> None:
    group = unique("dup")
    store = f"sqlite:///{tmp_path / 'shared.db'}"
    if registry == "zookeeper":
        locker = request.getfixturevalue("zk_url")
        where = locker
    else:
        locker, where = f"file://{tmp_path / 'shared.lock'}", store
    args = ["--store", store, "--locker", locker]
    first = broker_factory.start(name="same", group=group, extra_args=args,
                                 data_dir=broker_factory.data_dir("one"))
    second = broker_factory.new(name="same", group=group, extra_args=args,
                                data_dir=broker_factory.data_dir("two")).start()
    assert second.wait_exit(60) == EXIT_USAGE
    errors = [ln for ln in second.log_text().splitlines() if "error" in ln.lower()]
    assert len(errors) == 1, second.log_tail()
    assert errors[0].startswith("amqlite: error: name same: a live node of group "
                                f"{group} already has it (master on ")
    assert "Traceback" not in second.log_text()
    assert first.alive and first.is_serving()
    [view] = cluster_json("--registry", where, "--group", group)
    assert view["masters"] == ["same"] and view["slaves"] == []

    # Another name joins as slave; the crashed node's name is free again at once on this
    # host (its entry has not expired yet, but its pid is gone).
    other = broker_factory.start(name="other", group=group, extra_args=args, wait=False,
                                 data_dir=broker_factory.data_dir("three"))
    other.wait_log("slave of group")
    first.kill()
    other.wait_serving(60)
    mark = len(first.log_text())
    first.start()
    first.wait_log("slave of group", since=mark)
    assert first.alive and "already has it" not in first.log_text()[mark:]
