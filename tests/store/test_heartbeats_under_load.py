"""A control plane busy with its own work (real CPU on its event loop, as its controllers make
it at 10,000 VMs) while its nodes beat on time, from another host's connection and loop:
no beating node is judged silent, and a node that really went silent still is."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from nats.aio.client import Client

from controlplane.node.controller import NodeLifecycle
from events.jetstream.connect import connect
from events.jetstream.streams import ensure_all
from events.language.kinds.nodes import NODE_KIND
from events.language.subjects import Layout, aggregate_id, encode_token
from projections.cluster import ClusterState
from projections.kinds.vm import NodeView
from tests.system.harness import eventually

GRACE_SECONDS = 1.0
"""The test's grace period, short so a busy stretch can outlast it."""
SHORT_TURN_SECONDS = 0.1
"""One turn of a controller's work: many of them, each far below the grace."""
BEATS = 400
"""Beats put while the loop is busy in short turns: far more than one per turn."""
ROUNDS = 8
"""Node-monitor rounds that judge while the loop is busy in short turns."""


@pytest.fixture
async def installed(nats_url: str, prefix: str) -> AsyncIterator[tuple[Client, Layout]]:
    nc = await connect(nats_url, "test-heartbeats")
    layout = Layout(prefix)
    await ensure_all(nc.jetstream(), layout, 1)
    try:
        yield nc, layout
    finally:
        await nc.close()


def burn(seconds: float) -> None:
    """Real CPU work on the calling thread (the event loop's), no await in it."""
    until = time.monotonic() + seconds
    digest = b""
    while time.monotonic() < until:
        digest = hashlib.sha256(digest).digest()


@contextlib.contextmanager
def beating(url: str, layout: Layout, node: str) -> Iterator[list[int]]:
    """`node`'s agent on another host: it beats back to back on a connection and event loop
    of its own (a thread), whatever the control plane's loop is busy with. Yields the count
    of beats put so far."""
    put = [0]
    stop = threading.Event()

    async def beat() -> None:
        nc = await connect(url, "test-agent")
        kv = await nc.jetstream().key_value(layout.heartbeats_bucket)
        while not stop.is_set():
            await kv.put(encode_token(node), b"beat")
            put[0] += 1
        await nc.close()

    thread = threading.Thread(target=asyncio.run, args=(beat(),))
    thread.start()
    try:
        yield put
    finally:
        stop.set()
        thread.join()


async def heard(lifecycle: NodeLifecycle, node: str) -> bool:
    return node in lifecycle.last_seen


@contextlib.asynccontextmanager
async def watched(nc: Client, layout: Layout) -> AsyncIterator[tuple[NodeLifecycle, ClusterState]]:
    """A lifecycle controller watching the heartbeats of two Ready nodes, `alive` and
    `silent`, neither heard from yet."""
    lifecycle = NodeLifecycle(nc, layout, GRACE_SECONDS)
    state = ClusterState()
    for name in ("alive", "silent"):
        view = NodeView(aggregate_id(NODE_KIND, "", name))
        view.exists = view.ready = True  # as registered and Ready in the log
        state.views[view.id] = view
    assert [node.name for node in state.nodes()] == ["alive", "silent"]
    stop = asyncio.Event()
    watch = asyncio.ensure_future(lifecycle.watch(stop))
    try:
        yield lifecycle, state
    finally:
        stop.set()
        await watch


async def test_a_loop_busy_past_the_grace_judges_a_beating_node_by_its_beats(
        installed: tuple[Client, Layout], nats_url: str) -> None:
    """The loop is busy for twice the grace at a stretch, then the node monitor's round
    comes: the beats put meanwhile are not read yet, and must be before anyone is judged."""
    nc, layout = installed
    async with watched(nc, layout) as (lifecycle, state):
        with beating(nats_url, layout, "alive"):
            await eventually(lambda: heard(lifecycle, "alive"), what="a first beat of alive")
            for _ in range(3):
                burn(2 * GRACE_SECONDS)
                # a round may judge no one while the watch catches up (its read wait also
                # covers a round trip queued behind the backlog): the monitor asks again
                judged_at = await eventually(lambda: lifecycle.judgement_time(state),
                                             what="the watch caught up once the loop is free")
                assert lifecycle.fresh("alive", judged_at), "a beating node judged silent"
                assert not lifecycle.fresh("silent", judged_at)


async def test_a_loop_busy_in_short_turns_keeps_reading_heartbeats(
        installed: tuple[Client, Layout], nats_url: str) -> None:
    """The controllers keep the loop busy in many short turns while beats come far faster
    than one per turn: the watch keeps pace (a watch taking one entry per turn fell
    thousands of revisions behind here, as 40 s behind at 10,000 VMs), so the monitor can
    still judge, finds the silent node silent and never the beating one."""
    nc, layout = installed
    async with watched(nc, layout) as (lifecycle, state):
        busy = asyncio.Event()
        busy.set()

        async def controllers() -> None:
            while busy.is_set():
                burn(SHORT_TURN_SECONDS)
                await asyncio.sleep(0)  # the end of a turn, not a wait

        working = asyncio.ensure_future(controllers())
        judged, found_silent = 0, False
        try:
            with beating(nats_url, layout, "alive") as put:
                await eventually(lambda: heard(lifecycle, "alive"), what="a first beat of alive")
                while judged < ROUNDS or put[0] < BEATS or not found_silent:
                    judged_at = await eventually(lambda: lifecycle.judgement_time(state),
                                                 what="a round that judges")
                    judged += 1
                    assert lifecycle.fresh("alive", judged_at), "a beating node judged silent"
                    found_silent = found_silent or not lifecycle.fresh("silent", judged_at)
        finally:
            busy.clear()
            await working
