"""A `get` answer too large for one NATS message comes a page at a time (`continue`, as
kube-apiserver pages a list), and every page is cut from the first page's state: an object
created between two pages is in none of them, whether the list was still kept or had to be
rendered again at its sequence."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError

from events.connect import connect
from events.query import Answer, Query, query_subject
from events.streams import ensure_all
from events.subjects import Layout
from projections.paging import ListPages
from projections.service import MALFORMED, QUERIES_REFUSED, ReadService
from tests.store.helpers import SyncHandler, register

PAGE_BYTES = 1000
"""Two nodes a page (each about 500 bytes)."""


async def ask(nc: Client, layout: Layout, query: Query) -> Answer:
    reply = await nc.request(query_subject(layout, "user:test"), msgspec.msgpack.encode(query),
                             timeout=10)
    return msgspec.msgpack.decode(reply.data, type=Answer)


def names(items: list[dict[str, Any]]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


@pytest.fixture
async def service(handler: SyncHandler, nats_url: str,
                  prefix: str) -> AsyncIterator[tuple[ReadService, Client, Layout]]:
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-read-pages")
    await ensure_all(nc.jetstream(), layout)
    for i in range(7):
        await asyncio.to_thread(register, handler, f"n{i}")
    stop = asyncio.Event()
    reads = ReadService(nc, layout, page_bytes=PAGE_BYTES)
    running = asyncio.ensure_future(reads.run(stop))
    try:
        async with asyncio.timeout(10):
            while True:  # until the read service listens and has read every node
                try:
                    if len((await ask(nc, layout, Query(kind="Node"))).items) == 2:
                        break
                except NoRespondersError:
                    pass
                await asyncio.sleep(0.05)
        yield reads, nc, layout
    finally:
        stop.set()
        await running
        await nc.close()


async def test_a_list_comes_in_pages_of_the_first_pages_state(
        service: tuple[ReadService, Client, Layout], handler: SyncHandler) -> None:
    reads, nc, layout = service
    known = [f"n{i}" for i in range(7)]
    for query in (Query(kind="Node", after=await _head(reads)), Query(kind="Node", at=10**6)):
        first = await ask(nc, layout, query)
        assert names(first.items) == ["n0", "n1"] and first.continue_
        late = f"z{len(known)}"  # last by name: a page past the first would show it
        await asyncio.to_thread(register, handler, late)
        got, answer = list(first.items), first
        while answer.continue_:
            if len(got) == 4:
                reads.pages = ListPages()  # no longer kept: rendered again at its sequence
            answer = await ask(nc, layout, msgspec.structs.replace(
                query, continue_=answer.continue_))
            assert answer.sequence == first.sequence
            assert 1 <= len(answer.items) <= 2
            got += answer.items
        assert names(got) == known
        known.append(late)


async def test_a_token_it_did_not_give_is_refused_naming_continue(
        service: tuple[ReadService, Client, Layout]) -> None:
    reads, nc, layout = service
    answer = await ask(nc, layout, Query(kind="Node", continue_="1.x; drop"))
    assert answer.error.startswith("continue: ") and not answer.items
    assert reads.registry.get_sample_value(f"{QUERIES_REFUSED}_total",
                                           {"reason": MALFORMED}) == 1


async def _head(reads: ReadService) -> int:
    return reads.state.last_sequence
