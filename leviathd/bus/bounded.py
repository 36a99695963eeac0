"""The daemon's own calls on the bus, queued rather than burst.

dbus-daemon allows a connection a fixed number of calls awaiting a reply
(max_replies_per_connection, 128 on the system bus) and answers the rest with
LimitsExceeded at once. Every client call makes the daemon call the bus
(credentials), polkit and systemd; 150 concurrent `Run`s went past the limit
and polkit checks failed. This bus lets at most MAX_PENDING of the daemon's
calls be pending; the next ones wait their turn."""

from __future__ import annotations

import asyncio
from typing import Any

from dbus_fast import Message
from dbus_fast.aio import MessageBus

# Below the system bus's 128, with room for what does not go through call()
# (signals, replies) and for a distribution that lowered the limit a little.
MAX_PENDING = 96


class BoundedBus(MessageBus):
    def __init__(self, *args: Any, max_pending: int = MAX_PENDING, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending_calls = asyncio.Semaphore(max_pending)

    async def call(self, msg: Message) -> Message:
        async with self._pending_calls:
            return await super().call(msg)
