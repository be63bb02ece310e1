"""The lease, renewal by renewal: a leader resumed after another one led never takes the lease
back, even once the other's key has expired too (it would lead on its stale state); a
leader whose key expired while nobody else led takes it again; a renewal whose answer was
lost is recognised as the leader's own; a standby loads what its first decision needs before
it leads.

The key's expiry is modelled by deleting its message, which is what the bucket's TTL does
(the key absent, the stream's last sequence unchanged): no test waits out the TTL. The
bucket is made here as nats-py makes a bucket, but with deletes allowed for that."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client as Nats
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue
from structlog.testing import capture_logs

from controlplane.lease import LEASE_KEY, Lease
from controlplane.service import serve
from events.api.resources import _quantity_parser
from events.jetstream.streams import LEASE_TTL, ensure_all, get_key
from events.jetstream.transient import is_transient
from events.language.subjects import Layout
from tests.system.harness import eventually


@pytest.fixture
async def kv(nc: Nats, prefix: str) -> KeyValue:
    bucket = Layout(prefix).leases_bucket
    await nc.jetstream().add_stream(StreamConfig(
        name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], max_msgs_per_subject=1,
        max_age=LEASE_TTL, allow_rollup_hdrs=True, deny_delete=False,
        discard=DiscardPolicy.NEW))
    return await nc.jetstream().key_value(bucket)


async def expire(nc: Nats, kv: KeyValue, prefix: str) -> None:
    """The lease key's TTL runs out."""
    entry = await kv.get(LEASE_KEY)
    await nc.jetstream().delete_msg(f"KV_{Layout(prefix).leases_bucket}", entry.revision)


async def holder(kv: KeyValue) -> str:
    return ((await kv.get(LEASE_KEY)).value or b"").decode()


async def test_a_leader_resumed_after_another_led_stops_even_once_the_key_expired(
        nc: Nats, kv: KeyValue, prefix: str) -> None:
    layout, stop = Layout(prefix), asyncio.Event()
    old = Lease(nc, layout, "cp-a")
    assert await old.acquire(stop)
    await expire(nc, kv, prefix)  # cp-a stopped (SIGSTOP) past the TTL
    new = Lease(nc, layout, "cp-b")
    assert await new.acquire(stop)
    await expire(nc, kv, prefix)  # cp-b starved past the TTL in its turn
    assert not await old.renew(kv)  # resumed: another led since its revision
    assert await new.renew(kv)  # nobody led since cp-b's revision: cp-b's again
    assert await holder(kv) == "cp-b"
    assert not await old.renew(kv)


async def test_a_leader_keeps_what_is_its_own(nc: Nats, kv: KeyValue, prefix: str) -> None:
    """A renewal whose answer was lost, then an expiry while nobody else led: each time the
    lease is renewed, never lost; a standby that takes an expired key first wins it."""
    layout, stop = Layout(prefix), asyncio.Event()
    lease = Lease(nc, layout, "cp-a")
    assert await lease.acquire(stop)
    known = lease.revision
    assert await lease.renew(kv)
    lease.revision = known  # the renewal was stored, its answer lost
    assert await lease.renew(kv)
    await expire(nc, kv, prefix)
    assert await lease.renew(kv)
    assert await holder(kv) == "cp-a"
    await expire(nc, kv, prefix)
    assert await Lease(nc, layout, "cp-b").acquire(stop)
    assert not await lease.renew(kv)
    assert await holder(kv) == "cp-b"


async def test_a_standby_refused_while_the_key_expires_stands_by_and_then_leads(
        nc: Nats, kv: KeyValue, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby's create is refused while the leader's key is there, and the key expires
    before nats-py reads it back (to tell a deleted key, which it creates over, from a live
    one): the read finds nothing. That is a lost race, not a failure that stops the standby.
    The expiry is put in that gap: the refusal and the deletion are the server's, the client
    only deletes the key before it returns the refusal."""
    layout = Layout(prefix)
    stream = f"KV_{layout.leases_bucket}"
    write = kv._update

    async def expiring_after_a_refused_create(key: str, value: bytes, last: int | None = None,
                                              **options: Any) -> int:
        try:
            return await write(key, value, last=last, **options)
        except KeyWrongLastSequenceError:
            if last == 0:
                leader = await kv.get(key)
                await nc.jetstream().delete_msg(stream, leader.revision)
            raise

    monkeypatch.setattr(kv, "_update", expiring_after_a_refused_create)
    await kv.put(LEASE_KEY, b"cp-a")
    with pytest.raises(KeyNotFoundError):  # nats-py's own create, in that gap
        await kv.create(LEASE_KEY, b"cp-b")
    await kv.put(LEASE_KEY, b"cp-a")
    standby = Lease(nc, layout, "cp-b")
    assert not await standby._try(kv)
    assert await standby._try(kv)  # next period: the expired lease is its
    assert await holder(kv) == "cp-b"


async def test_a_key_read_while_its_bucket_cannot_be_found_is_not_taken_for_absent(
        nc: Nats, kv: KeyValue, prefix: str) -> None:
    """nats-py reads "stream not found" (a cluster electing the bucket's leader says it too)
    as "key not found": `get_key` raises it as the server said it, transient, so a leader
    does not take its lease for lapsed, nor a dispatcher its checkpoint for none."""
    assert await get_key(kv, LEASE_KEY) is None
    await kv.put(LEASE_KEY, b"cp-a")
    await kv.delete(LEASE_KEY)
    assert await get_key(kv, LEASE_KEY) is None  # deleted
    await nc.jetstream().delete_stream(f"KV_{Layout(prefix).leases_bucket}")
    with pytest.raises(NotFoundError) as raised:
        await get_key(kv, LEASE_KEY)
    assert is_transient(raised.value)


async def test_a_standby_pays_for_its_first_decision_before_it_leads(
        nats_url: str, nc: Nats, prefix: str) -> None:
    """What the first decision needs and loads on first use (kubernetes' quantity parser:
    half a second of CPU on the event loop) is loaded while standing by, not right after
    taking the lease, when a stalled loop renews late."""
    layout, stop = Layout(prefix), asyncio.Event()
    await ensure_all(nc.jetstream(), layout)
    assert await Lease(nc, layout, "cp-a").acquire(stop)
    _quantity_parser.cache_clear()
    with capture_logs() as logs:
        standby = asyncio.ensure_future(serve(nats_url, layout, holder="cp-b", stop=stop))
        try:
            async def standing_by() -> bool:
                return any(r["event"].startswith("standing by") for r in logs)

            await eventually(standing_by, what="the standby waiting for the lease")
            assert _quantity_parser.cache_info().currsize == 1
        finally:
            stop.set()
            assert await standby  # stopped, not lost
