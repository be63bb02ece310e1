"""A `get` answer too large for one NATS message comes a page at a time (`continue`, as
kube-apiserver pages a list), and every page is cut from the first page's state: an object
created between two pages is in none of them, whether the list was still kept or had to be
rendered again at its sequence. The HTTP API pages a list asked with `limit` the same way.
`events.language.query.ask` (a node agent's reads) takes every page, and a node's list
of VMIs holds only that node's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError

from events.jetstream.connect import connect
from events.jetstream.streams import ensure_all
from events.language import query as queries
from events.language.query import Answer, Query, query_subject
from events.language.subjects import Layout
from projections import http
from projections.paging import Listed, ListPages
from projections.ratelimit import AskerLimits, AuditLimit
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
        await _folded(nc, layout)
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


async def _http_get(session: aiohttp.ClientSession, port: int,
                    path: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, await response.json(), dict(response.headers)


async def test_an_http_list_with_limit_comes_in_pages_of_the_first_pages_state(
        service: tuple[ReadService, Client, Layout], handler: SyncHandler) -> None:
    """kube-apiserver's `limit`/`continue`: `remainingItemCount` while items remain, one
    `resourceVersion` for every page, an object created between pages on none of them, kept
    while kept; no `limit`, the whole list."""
    reads, nc, layout = service
    runner = await http.serve(reads.state, reads, "127.0.0.1", 0)
    [(_, port, *_)] = runner.addresses
    try:
        async with aiohttp.ClientSession() as session:
            for unpaged in ("", "?limit=0", "?limit=-1"):  # kube-apiserver: no limit
                code, whole, _ = await _http_get(session, port, f"/api/v1/nodes{unpaged}")
                assert code == 200 and "continue" not in whole["metadata"]
                assert names(whole["items"]) == [f"n{i}" for i in range(7)]
            code, first, _ = await _http_get(session, port, "/api/v1/nodes?limit=3")
            assert code == 200 and names(first["items"]) == ["n0", "n1", "n2"]
            assert first["metadata"]["remainingItemCount"] == 4
            await asyncio.to_thread(register, handler, "m-late")  # would be on the next page
            await _folded(nc, layout)
            got, page = list(first["items"]), first
            while "continue" in page["metadata"]:
                token = page["metadata"]["continue"]
                code, page, _ = await _http_get(session, port,
                                                f"/api/v1/nodes?limit=3&continue={token}")
                assert code == 200
                assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
                got += page["items"]
                assert page["metadata"].get("remainingItemCount", 0) == 7 - len(got)
            assert names(got) == [f"n{i}" for i in range(7)]
            await _folded(nc, layout)
            code, now, _ = await _http_get(session, port, "/api/v1/nodes?limit=100")
            assert names(now["items"]) == ["m-late", *(f"n{i}" for i in range(7))]
    finally:
        await runner.cleanup()


async def test_an_http_page_no_longer_kept_is_rebuilt_as_an_audit_read(
        service: tuple[ReadService, Client, Layout], handler: SyncHandler) -> None:
    """A server restarted between pages keeps no list: the next page is rebuilt from the log
    at the first page's state, and past the asker's bucket it is 429 with `Retry-After`."""
    reads, nc, layout = service
    reads.audit_limits = AskerLimits(AuditLimit(per_second=0.01, burst=1))
    runner = await http.serve(reads.state, reads, "127.0.0.1", 0)
    [(_, port, *_)] = runner.addresses
    try:
        async with aiohttp.ClientSession() as session:
            _, first, _ = await _http_get(session, port, "/api/v1/nodes?limit=2")
            token = first["metadata"]["continue"]
        await runner.cleanup()
        await asyncio.to_thread(register, handler, "m-late")
        await _folded(nc, layout)
        runner = await http.serve(reads.state, reads, "127.0.0.1", port)
        async with aiohttp.ClientSession() as session:
            code, page, _ = await _http_get(session, port,
                                            f"/api/v1/nodes?limit=2&continue={token}")
            assert code == 200 and names(page["items"]) == ["n2", "n3"]
            assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
            again = page["metadata"]["continue"]
            await runner.cleanup()
            runner = await http.serve(reads.state, reads, "127.0.0.1", port)
            code, refused, headers = await _http_get(
                session, port, f"/api/v1/nodes?limit=2&continue={again}")
            assert (code, refused["reason"]) == (429, "TooManyRequests")
            assert int(headers["Retry-After"]) == refused["details"]["retryAfterSeconds"] > 0
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("query", "message"), [
    ("limit=ten", "limit: must be an integer, not 'ten'"),
    ("limit= 5", "limit: must be an integer, not ' 5'"),
    ("limit=2&continue=1.x;drop", "continue: not a token this service gave, '1.x;drop'"),
    ("limit=2&continue=99999999.0", "continue: not a token this service gave, '99999999.0' "
                                    "(a state it has not reached)")])
async def test_an_http_list_refuses_a_bad_limit_or_continue_naming_it(
        service: tuple[ReadService, Client, Layout], query: str, message: str) -> None:
    reads, _, _ = service
    runner = await http.serve(reads.state, reads, "127.0.0.1", 0)
    [(_, port, *_)] = runner.addresses
    try:
        async with aiohttp.ClientSession() as session:
            code, status, _ = await _http_get(session, port, f"/api/v1/nodes?{query}")
        assert (code, status["reason"], status["message"]) == (400, "BadRequest", message)
        assert reads.registry.get_sample_value(f"{QUERIES_REFUSED}_total",
                                               {"reason": http.BAD_PARAMETER}) == 1
    finally:
        await runner.cleanup()


def test_one_asker_paging_many_lists_keeps_anothers() -> None:
    pages = ListPages(kept=3, kept_each=2)
    listed = Listed.of([{"n": i} for i in range(3)])
    pages.page(("bob", "Node"), 1, listed, 0, limit=1)
    for sequence in (1, 2, 3):
        pages.page(("alice", "Node"), sequence, listed, 0, limit=1)
    assert pages.get(("bob", "Node"), 1) is listed
    assert [pages.get(("alice", "Node"), s) is listed for s in (1, 2, 3)] == [False, True, True]


async def _folded(nc: Client, layout: Layout) -> None:
    """Once the read service has folded every event in the log."""
    last = (await nc.jetstream().stream_info(layout.events_stream)).state.last_seq
    assert not (await ask(nc, layout, Query(kind="Node", after=last))).error


async def _head(reads: ReadService) -> int:
    return reads.state.last_sequence
