"""The read service answers queries concurrently: one waiting for the log to reach its
`after` (up to READ_WAIT_SECONDS) does not hold up a query that can be answered now."""

from __future__ import annotations

import asyncio

import msgspec
from nats.errors import NoRespondersError

from events.jetstream.connect import connect
from events.jetstream.streams import ensure_all
from events.language.query import Answer, Query, query_subject
from events.language.subjects import Layout
from projections.service import READ_WAIT_SECONDS, ReadService
from tests.store.helpers import SyncHandler, register


async def test_a_query_waiting_for_the_log_does_not_hold_up_the_next(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    await asyncio.to_thread(register, handler, "n1")
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-read-service")
    await ensure_all(nc.jetstream(), layout)
    stop = asyncio.Event()
    reads = asyncio.ensure_future(ReadService(nc, layout).run(stop))
    subject = query_subject(layout, "user:test")

    async def ask(after: int, timeout: float) -> Answer:
        reply = await nc.request(subject, msgspec.msgpack.encode(Query(kind="Node", after=after)),
                                 timeout=timeout)
        return msgspec.msgpack.decode(reply.data, type=Answer)

    try:
        async with asyncio.timeout(10):
            while True:  # until the read service listens
                try:
                    await ask(0, 1)
                    break
                except NoRespondersError:
                    await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(ask(10**9, READ_WAIT_SECONDS + 5))
        await nc.flush()
        answer = await ask(1, READ_WAIT_SECONDS / 2)
        assert [n["metadata"]["name"] for n in answer.items] == ["n1"]
        assert not waiting.done()
        waiting.cancel()
    finally:
        stop.set()
        await reads
        await nc.close()


async def test_a_query_after_a_position_that_holds_no_event_is_answered(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    """A node agent asks `after` the events stream's last sequence; a command's read guard
    (`<p>.guard`, no event) may be that message. Before, the query waited it out and failed."""
    await asyncio.to_thread(register, handler, "n1")
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-read-service")
    await ensure_all(nc.jetstream(), layout)
    guard = await nc.jetstream().publish(layout.guard_subject, b"")
    stop = asyncio.Event()
    reads = asyncio.ensure_future(ReadService(nc, layout).run(stop))
    try:
        async with asyncio.timeout(READ_WAIT_SECONDS / 2):
            while True:  # until the read service listens
                try:
                    reply = await nc.request(
                        query_subject(layout, "user:test"),
                        msgspec.msgpack.encode(Query(kind="Node", after=guard.seq)),
                        timeout=READ_WAIT_SECONDS)
                    break
                except NoRespondersError:
                    await asyncio.sleep(0.05)
        answer = msgspec.msgpack.decode(reply.data, type=Answer)
        assert answer.error == ""
        assert [n["metadata"]["name"] for n in answer.items] == ["n1"]
    finally:
        stop.set()
        await reads
        await nc.close()
