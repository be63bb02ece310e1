"""Leader election: one key in the `P_LEASES` bucket. Whoever creates it leads and renews it
by compare-and-set; the bucket's TTL frees it when a leader dies. A replica restarted under
the same holder id (a supervisor's restart, a pod's container restart) takes its own lease
back at once instead of waiting out the TTL."""

from __future__ import annotations

import asyncio

import structlog
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from events.aio import pause_unless_stopped
from events.streams import LEASE_TTL
from events.subjects import Layout

log = structlog.get_logger(__name__)

LEASE_KEY = "controlplane"
RENEW_PERIOD = LEASE_TTL / 3


class Lease:
    def __init__(self, nc: Client, layout: Layout, holder: str) -> None:
        self.nc = nc
        self.layout = layout
        self.holder = holder
        self.revision = 0

    async def _kv(self) -> KeyValue:
        return await self.nc.jetstream().key_value(self.layout.leases_bucket)

    async def _try(self, kv: KeyValue) -> bool:
        value = self.holder.encode()
        try:
            entry = await kv.get(LEASE_KEY)
        except KeyNotFoundError:
            entry = None
        try:
            if entry is not None and entry.value == value:
                self.revision = await kv.update(LEASE_KEY, value, last=entry.revision)
            else:
                self.revision = await kv.create(LEASE_KEY, value)
        except KeyWrongLastSequenceError:
            return False
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (True) or `stop` is set (False)."""
        kv = await self._kv()
        waiting = False
        while not stop.is_set():
            if await self._try(kv):
                log.info("leading", holder=self.holder)
                return True
            if not waiting:
                log.info("standing by: another replica leads", holder=self.holder)
                waiting = True
            await pause_unless_stopped(stop, RENEW_PERIOD)
        return False

    async def hold(self, stop: asyncio.Event, lost: asyncio.Event) -> None:
        """Renew until `stop`; set `lost` if another replica took the lease meanwhile."""
        kv = await self._kv()
        while not stop.is_set():
            await pause_unless_stopped(stop, RENEW_PERIOD)
            if stop.is_set():
                return
            try:
                self.revision = await kv.update(LEASE_KEY, self.holder.encode(),
                                                last=self.revision)
            except KeyWrongLastSequenceError:
                log.error("lease lost; stopping", holder=self.holder)
                lost.set()
                return
