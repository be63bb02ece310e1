"""Leader election: one key in the `P_LEASES` bucket. Whoever creates it leads and renews it
by compare-and-set; the bucket's TTL frees it when a leader dies. A replica restarted under
the same holder id (a supervisor's restart, a pod's container restart) takes its own lease
back at once instead of waiting out the TTL.

A renewal NATS cannot take now (a server of the cluster lost, the bucket's leader being
elected) is tried again soon, never a reason to stop: the lease is lost only when another
replica holds it, or held it since this one's last renewal. A renewal whose answer was lost
(stored, but the revision unknown) is recognised by the value: ours still, it is renewed
from there. A key that expired under its leader (a process stopped or starved past the TTL)
is created again by that leader only if the bucket took no write since its last renewal:
otherwise another replica led meanwhile, and a leader resumed on its stale state stops."""

from __future__ import annotations

import asyncio

import structlog
from nats.aio.client import Client
from nats.js.api import Header
from nats.js.errors import APIError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from events.jetstream.streams import LEASE_TTL, create_key, get_key
from events.jetstream.transient import is_transient, note, retry_until_stopped
from events.language.subjects import Layout
from events.runtime.aio import pause_unless_stopped

log = structlog.get_logger(__name__)

LEASE_KEY = "controlplane"
RENEW_PERIOD = LEASE_TTL / 3
WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a publish whose expected last (subject) sequence is not so."""


class Lease:
    def __init__(self, nc: Client, layout: Layout, holder: str) -> None:
        self.nc = nc
        self.layout = layout
        self.holder = holder
        self.revision = 0

    async def _kv(self, stop: asyncio.Event) -> KeyValue | None:
        """The bucket (None if `stop` came first)."""
        return await retry_until_stopped(
            lambda: self.nc.jetstream().key_value(self.layout.leases_bucket),
            "binding the lease bucket", stop)

    async def _try(self, kv: KeyValue) -> bool:
        value = self.holder.encode()
        entry = await get_key(kv, LEASE_KEY)
        if entry is None or entry.value != value:
            created = await create_key(kv, LEASE_KEY, value)
            if created is None:
                return False
            self.revision = created
            return True
        try:
            self.revision = await kv.update(LEASE_KEY, value, last=entry.revision)
        except KeyWrongLastSequenceError:
            return False
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (True) or `stop` is set (False)."""
        kv = await self._kv(stop)
        waiting = False
        attempt = 0
        while kv is not None and not stop.is_set():
            try:
                if await self._try(kv):
                    log.info("leading", holder=self.holder)
                    return True
            except Exception as e:
                if not is_transient(e):
                    raise
                attempt += 1
                await pause_unless_stopped(stop, note("taking the lease", e, attempt))
                continue
            attempt = 0
            if not waiting:
                log.info("standing by: another replica leads", holder=self.holder)
                waiting = True
            await pause_unless_stopped(stop, RENEW_PERIOD)
        return False

    async def hold(self, stop: asyncio.Event, lost: asyncio.Event) -> None:
        """Renew until `stop`; set `lost` if another replica took the lease meanwhile."""
        kv = await self._kv(stop)
        period = RENEW_PERIOD
        attempt = 0
        while kv is not None and not stop.is_set():
            await pause_unless_stopped(stop, period)
            if stop.is_set():
                return
            try:
                if not await self.renew(kv):
                    log.error("lease lost; stopping", holder=self.holder)
                    lost.set()
                    return
            except Exception as e:
                if not is_transient(e):
                    raise
                attempt += 1
                period = min(note("renewing the lease", e, attempt), RENEW_PERIOD)
                continue
            attempt, period = 0, RENEW_PERIOD

    async def renew(self, kv: KeyValue) -> bool:
        """Renew from the revision this leader wrote last; False if the lease is not ours
        any more: another replica holds it, or wrote it since (then expired), so this one
        may have been stopped or starved past the TTL while another led."""
        value = self.holder.encode()
        try:
            self.revision = await kv.update(LEASE_KEY, value, last=self.revision)
            return True
        except KeyWrongLastSequenceError:
            pass
        entry = await get_key(kv, LEASE_KEY)
        if entry is None:
            return await self._create_unless_written_since()
        if entry.value != value:
            return False
        try:  # ours: a renewal whose answer was lost, stored at a revision we did not learn
            self.revision = await kv.update(LEASE_KEY, value, last=entry.revision)
        except KeyWrongLastSequenceError:
            return False
        return True

    async def _create_unless_written_since(self) -> bool:
        """The expired key created again, in one conditional write: absent, and nothing
        written to the bucket (it holds this one key) since our revision. The condition is
        the server's, so a standby creating it at the same moment wins or loses whole."""
        headers = {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: "0",
                   Header.EXPECTED_LAST_SEQUENCE.value: str(self.revision)}
        try:
            ack = await self.nc.jetstream().publish(
                f"$KV.{self.layout.leases_bucket}.{LEASE_KEY}", self.holder.encode(),
                headers=headers)
        except APIError as e:
            if getattr(e, "err_code", None) == WRONG_LAST_SEQUENCE:
                return False
            raise
        self.revision = ack.seq
        log.warning("lease expired under its leader, nobody led meanwhile: taken again",
                    holder=self.holder, revision=ack.seq)
        return True
