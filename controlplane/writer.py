"""The control plane's one writer: every command, from a client or a controller, runs here,
one at a time, on a thread of its own (the `eventsourcing` library is synchronous)."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

import controlplane.hco_commands
import controlplane.node_commands
import controlplane.vm_commands
import controlplane.vmi_commands
from controlplane.handling import CommandHandler, Result, VirtbusApplication
from events.messages import Command
from events.subjects import Layout

HANDLER_MODULES = (controlplane.vm_commands, controlplane.vmi_commands,
                   controlplane.node_commands, controlplane.hco_commands)
"""Imported for their `@handles` registrations."""


def application(nats_url: str, layout: Layout) -> VirtbusApplication:
    return VirtbusApplication(env={
        "PERSISTENCE_MODULE": "events.jetstream",
        "NATS_URL": nats_url,
        "VIRTBUS_PREFIX": layout.prefix,
    })


class Writer:
    def __init__(self, nats_url: str, layout: Layout) -> None:
        self.app = application(nats_url, layout)
        self.handler = CommandHandler(self.app)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="writer")

    async def execute(self, command: Command, *, check_prior: bool = False) -> Result:
        loop = asyncio.get_running_loop()
        run = functools.partial(self.handler.execute, command, check_prior=check_prior)
        return await loop.run_in_executor(self._pool, run)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.app.factory.close()
