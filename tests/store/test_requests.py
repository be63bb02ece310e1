"""Requests on one inbox per connection (`events.jetstream.requests`): every answer reaches the one
who asked, whatever order they come in; a request nobody answers fails at its deadline,
through the one shared timer; nobody listening is "no responders" (a stored message that
carries a 503 status is an answer: `test_directget`)."""

from __future__ import annotations

import asyncio
import gc
import random
import weakref

import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from events.jetstream.connect import connect
from events.jetstream.requests import _BY_CONNECTION, Requests, request


async def test_answers_in_any_order_reach_each_asker(nats_url: str, prefix: str) -> None:
    nc = await connect(nats_url, "test-requests")
    asked: list[Msg] = []
    everyone = asyncio.Event()
    count = 200

    async def gather_then_answer_shuffled(msg: Msg) -> None:
        asked.append(msg)
        if len(asked) == count:
            everyone.set()

    try:
        await nc.subscribe(f"{prefix}.echo", cb=gather_then_answer_shuffled)
        requests = Requests(nc)
        waiting = [asyncio.ensure_future(requests.request(f"{prefix}.echo", str(n).encode(),
                                                          timeout=30))
                   for n in range(count)]
        async with asyncio.timeout(30):
            await everyone.wait()  # every request is out before the first answer
        random.Random(7).shuffle(asked)
        for msg in asked:
            await msg.respond(b"answer " + msg.data)
        answers = await asyncio.gather(*waiting)
        assert [a.data for a in answers] == [f"answer {n}".encode() for n in range(count)]
        assert not requests._waiting  # nothing left behind
    finally:
        await nc.close()


async def test_a_request_nobody_answers_fails_at_its_deadline(nats_url: str,
                                                               prefix: str) -> None:
    """Two requests with different deadlines: the first fails at its own (not before: the
    loop's clock says so), the other is still answered after it, and an answer that comes
    after its request failed is dropped. Nobody listening is "no responders"; a cancelled
    request leaves nothing behind."""
    nc = await connect(nats_url, "test-requests")
    heard: list[Msg] = []
    arrived = asyncio.Event()

    async def hold(msg: Msg) -> None:  # a responder that answers only when told
        heard.append(msg)
        arrived.set()

    async def heard_at_least(count: int) -> None:
        async with asyncio.timeout(30):
            while len(heard) < count:
                arrived.clear()
                await arrived.wait()

    try:
        await nc.subscribe(f"{prefix}.held", cb=hold)
        requests = Requests(nc)
        loop = asyncio.get_running_loop()
        began = loop.time()
        short = asyncio.ensure_future(requests.request(f"{prefix}.held", b"short", timeout=0.3))
        long = asyncio.ensure_future(requests.request(f"{prefix}.held", b"long", timeout=60))
        with pytest.raises(NatsTimeoutError):
            await short
        assert loop.time() - began >= 0.3
        assert not long.done()
        await heard_at_least(2)
        for msg in heard:
            await msg.respond(b"late " + msg.data)  # the short one's answer comes too late
        assert (await long).data == b"late long"
        assert not requests._waiting
        with pytest.raises(NoRespondersError):
            await requests.request(f"{prefix}.nobody", b"?", timeout=30)
        cancelled = asyncio.ensure_future(requests.request(f"{prefix}.held", timeout=30))
        await heard_at_least(3)
        assert requests._waiting
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not requests._waiting
    finally:
        await nc.close()


async def test_a_connection_s_requests_go_when_the_connection_does(nats_url: str,
                                                                    prefix: str) -> None:
    """`request` keeps one `Requests` per connection, which does not keep the connection."""
    nc = await connect(nats_url, "test-requests")

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(f"{prefix}.echo", cb=echo)
    assert (await request(nc, f"{prefix}.echo", b"one", timeout=30)).data == b"one"
    assert (await request(nc, f"{prefix}.echo", b"two", timeout=30)).data == b"two"
    assert len(_BY_CONNECTION) >= 1 and nc in _BY_CONNECTION
    gone = weakref.ref(nc)
    await nc.close()
    del nc
    gc.collect()
    assert gone() is None


async def _ignore(_msg: Msg) -> None:
    """Hears a request and says nothing."""
