"""The node's Role enum reaches the registry as the plain strings every reader knows
("master", "slave"), on each backend: a driver that adapted an enum by its name would
write "MASTER" and discovery would find no master."""

from __future__ import annotations

import asyncio

import pytest

from amqlite.registry import ROLES, Member, Role, open_registry, read_members
from tests.cluster.test_registry import SLACK, settings
from tests.helpers.poll import apoll

#: Announce, then read back; a write takes one heartbeat at most (STORE_HEARTBEAT_INTERVAL).
READ_BACK_WITHIN = 10.0


async def _read_until(url: str, group: str, role: str, timeout: float) -> Member:
    """Poll the registry (deadline, not a fixed sleep) until ``group``'s entry has ``role``."""
    members, _ = await apoll(lambda: asyncio.to_thread(read_members, url, group),
                             lambda members: bool(members) and members[0].role == role,
                             timeout=timeout, what=f"{role!r} read back")
    return members[0]


def test_roles_the_registry_carries() -> None:
    assert [r.value for r in ROLES] == ["master", "slave"]
    assert Role.STARTING not in ROLES and Role.DEMOTED not in ROLES


@pytest.mark.integration
def test_store_registry_stores_the_role_enum_as_its_plain_string(store_url: str) -> None:
    s = settings("n1", "roles", store_url)

    async def scenario() -> None:
        reg = open_registry(s)
        try:
            await reg.announce(Role.SLAVE, None)
            slave = await _read_until(store_url, "roles", "slave", READ_BACK_WITHIN)
            assert type(slave.role) is str and slave.epoch is None
            await reg.announce(Role.MASTER, 9)
            master = await _read_until(store_url, "roles", "master", READ_BACK_WITHIN + SLACK)
            assert type(master.role) is str and master.epoch == 9
        finally:
            await reg.withdraw()
            await reg.close()

    asyncio.run(scenario())
