"""Requests on one inbox per connection (`events.requests`): every answer reaches the one
who asked, whatever order they come in; a request nobody answers fails at its deadline,
through the one shared timer; nobody listening is "no responders" (a stored message that
carries a 503 status is an answer: `test_directget`)."""

from __future__ import annotations

import asyncio
import random

import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from events.connect import connect
from events.requests import Requests


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
    nc = await connect(nats_url, "test-requests")
    try:
        await nc.subscribe(f"{prefix}.silent", cb=_ignore)  # a responder that never answers
        requests = Requests(nc)
        with pytest.raises(NatsTimeoutError):
            await requests.request(f"{prefix}.silent", b"?", timeout=0.3)
        assert not requests._waiting
        assert requests._sweeper is None  # the timer stops once nothing waits
        with pytest.raises(NoRespondersError):
            await requests.request(f"{prefix}.nobody", b"?", timeout=30)
        cancelled = asyncio.ensure_future(requests.request(f"{prefix}.silent", timeout=30))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not requests._waiting
    finally:
        await nc.close()


async def _ignore(_msg: Msg) -> None:
    """Hears a request and says nothing."""
