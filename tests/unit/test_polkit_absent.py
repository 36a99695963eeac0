"""Issue 50: polkit fails closed (bus/polkit.py). On a real bus with no
polkit on it (the test's own dbus-daemon), a caller who is not root is not
authorized to anything; root alone is."""

from __future__ import annotations

import asyncio

from dbus_fast.aio import MessageBus
from session_bus import bus_address  # noqa: F401  (the fixture)

from leviathd.authority import Caller
from leviathd.bus import polkit


def test_with_no_polkit_only_root_is_allowed(bus_address: str) -> None:  # noqa: F811
    async def go() -> tuple[bool, bool]:
        bus = await MessageBus(bus_address=bus_address).connect()
        try:
            user = Caller(sender=bus.unique_name or "", uid=1000, pid=None)
            root = Caller(sender=bus.unique_name or "", uid=0, pid=None)
            return (await polkit.is_authorized(bus, user, "org.leviath.agent.run"),
                    await polkit.is_authorized(bus, root, "org.leviath.agent.run"))
        finally:
            bus.disconnect()

    assert asyncio.run(go()) == (False, True)
