"""A `get` answer too large for one NATS message comes a page at a time (`continue`, as
kube-apiserver pages a list), and every page is cut from the first page's state: an object
created between two pages is in none of them, whether the list was still kept or had to be
rendered again at its sequence. `events.query.ask` (a node agent's reads) takes every page,
and a node's list of VMIs holds only that node's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError

from events import query as queries
from events.connect import connect
from events.query import Answer, Query, query_subject
from events.streams import ensure_all
from events.subjects import Layout
from projections.paging import ListPages
from projections.rendering import render
from projections.service import MALFORMED, QUERIES_REFUSED, ReadService
from tests.store.helpers import SyncHandler, register
from tests.store.scheduling_helpers import Cluster

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


async def test_ask_takes_every_page_of_a_list(
        service: tuple[ReadService, Client, Layout]) -> None:
    """A node agent that read only a first page would take the VMIs on the others for gone
    and remove their guests: `ask` answers the whole list."""
    _, nc, layout = service
    answer = await queries.ask(nc, layout, Query(kind="Node"), "user:test")
    assert not answer.error and not answer.continue_
    assert names(answer.items) == [f"n{i}" for i in range(7)]


def test_a_nodes_list_of_vmis_holds_only_that_nodes(handler: SyncHandler) -> None:
    cluster = Cluster(handler)
    for node in ("a", "b"):
        cluster.node(node)
    for i in range(6):
        cluster.vmi(f"vm-{i}")
    cluster.schedule()
    placed = {f"vm-{i}": cluster.node_of(f"vm-{i}") for i in range(6)}
    assert set(placed.values()) == {"a", "b"}
    for node in ("a", "b"):
        listed = render(cluster.state, Query(kind="VirtualMachineInstance", node=node))
        assert names(listed) == sorted(n for n, on in placed.items() if on == node)
        assert {item["status"]["nodeName"] for item in listed} == {node}


async def _head(reads: ReadService) -> int:
    return reads.state.last_sequence
