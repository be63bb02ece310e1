"""The control plane's one writer: every command, from a client, a node report or a
controller, is decided and recorded here, on the process's own event loop.

Commands for one object run in the order they arrive; commands for different objects run
concurrently, their appends pipelined on one connection. Nothing here is bound to a thread:
a decision is CPU on the loop, everything else is awaiting the server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from nats.aio.client import Client

from controlplane.decision import target_key
from controlplane.writeprotocol import Announce, CommandHandler, Result, nobody
from events.jetstream.datastore import EventLog
from events.language.messages import Command
from events.language.subjects import Layout


class Turns:
    """One FIFO lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def of(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class Writer:
    def __init__(self, nc: Client, layout: Layout) -> None:
        self.handler = CommandHandler(EventLog(nc, layout))
        self._turns = Turns()

    async def execute(self, command: Command, announce: Announce = nobody) -> Result:
        """Decide and record `command` (`CommandHandler.execute`) in its turns: after every
        command with its id, then after every command for its object. Commands sharing an
        id (one sent again, or reused for another object) must not both find no marker and
        each store an event alone: the later finds the earlier's outcome. Ids first, then
        objects, always: a task holding an object's turn waits for nothing, so no cycle."""
        async with self._turns.of(f"id:{command.id}"), self._turns.of(target_key(command)):
            return await self.handler.execute(command, announce)
