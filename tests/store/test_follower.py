"""`follow` hands every event over once, even when events are appended while it replays."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from events.jetstream.connect import connect
from events.language.codec import Event
from events.language.messages import Command
from events.language.subjects import Layout
from projections import follower
from tests.store.helpers import SyncHandler, register


async def test_events_appended_during_replay_are_delivered_once(
        handler: SyncHandler, nats_url: str, prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay page that runs past the head read at the start (here: the second, short page
    holds events appended while the first was handed over) must not be delivered again by
    the live consumer."""
    for i in range(4):
        register(handler, f"n{i}")
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-follower")
    seen: list[int] = []
    appended: list[int] = []
    live: list[int] = []
    stop = asyncio.Event()

    async def on_event(sequence: int, _event: Event) -> None:
        seen.append(sequence)
        if len(seen) == 1:
            appended.extend(await asyncio.to_thread(register, handler, "during-replay"))
        if live and sequence == live[-1]:
            stop.set()

    async def on_caught_up() -> None:
        live.extend(await asyncio.to_thread(register, handler, "live"))

    try:
        target = await follower.head(nc, layout)
        monkeypatch.setattr(follower, "PAGE", target - 1)  # the head starts a short page 2
        await asyncio.wait_for(follower.follow(nc, layout, on_event,
                                               on_caught_up=on_caught_up, stop=stop), 30)
    finally:
        await nc.close()
    assert appended and min(appended) > target
    assert seen == list(range(1, live[-1] + 1))  # every event (commands' too), once, in order


async def test_since_time_starts_at_the_first_event_stored_from_then(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    """`watch --since TIME`: the first sequence stored at or after TIME, else past the head."""
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-since")
    try:
        before = datetime.now(UTC)
        earlier = register(handler, "early")
        between = datetime.now(UTC)
        later = register(handler, "late")
        assert await follower.start_sequence_at(nc, layout, before) == 1
        start = await follower.start_sequence_at(nc, layout, between)
        assert max(earlier) < start <= min(later)
        future = datetime.now(UTC) + timedelta(hours=1)
        assert await follower.start_sequence_at(nc, layout, future) == \
            await follower.head(nc, layout) + 1
    finally:
        await nc.close()


async def test_a_lost_live_consumer_is_replaced_and_nothing_comes_twice(
        handler: SyncHandler, nats_url: str, prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The live consumer vanishes on the server (as after a reset nats-py could not finish):
    the follow notices the log moved on without it and resubscribes where it was, well
    before nats-py's own heartbeat check (two missed 5 s heartbeats) would."""
    monkeypatch.setattr(follower, "STALL_CHECK_SECONDS", 0.2)
    register(handler, "before")
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-follower-stall")
    js = nc.jetstream()
    seen: list[int] = []
    later: list[int] = []
    stop = asyncio.Event()

    async def on_event(sequence: int, _event: Event) -> None:
        seen.append(sequence)
        if later and sequence == later[-1]:
            stop.set()

    task = asyncio.ensure_future(follower.follow(nc, layout, on_event, stop=stop))
    try:
        async with asyncio.timeout(10):
            while not (consumers := await js.consumers_info(layout.events_stream)):
                await asyncio.sleep(0.05)  # poll until the live consumer exists
        for consumer in consumers:
            await js.delete_consumer(layout.events_stream, consumer.name)
        later.extend(await asyncio.to_thread(register, handler, "after"))
        await asyncio.wait_for(task, 5)
    finally:
        task.cancel()
        await nc.close()
    assert seen == list(range(1, later[-1] + 1))  # every event, once, in order


async def test_a_live_follow_of_some_kinds_gets_theirs_only_and_no_stall_from_the_rest(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    """The control plane follows live every kind but commands' markers (`live_kinds`):
    each node event comes once and in order, no marker comes, and a marker stored past the
    last node event is not taken for an event the follow missed (that would replace the
    consumer after every silence)."""
    register(handler, "before")
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-follower-kinds")
    seen: list[tuple[int, str]] = []
    live: list[int] = []
    stop = asyncio.Event()

    async def on_event(sequence: int, event: Event) -> None:
        seen.append((sequence, event.originator_id.split(".", 1)[0]))
        if live and sequence == live[-1]:
            stop.set()

    async def on_caught_up() -> None:
        live.extend(await asyncio.to_thread(register, handler, "live"))
        refused = await asyncio.to_thread(handler.execute, Command(  # a marker alone, last
            id=str(uuid.uuid4()), actor="user:alice", kind="Node", verb="fly", name="live"))
        assert not refused.outcome.accepted

    try:
        await asyncio.wait_for(follower.follow(nc, layout, on_event, on_caught_up=on_caught_up,
                                               stop=stop, live_kinds=("node",)), 30)
        head = await follower.head(nc, layout)
        nodes = (layout.events_filter("node"),)
        missed = await follower._missed_some(nc, layout, nodes, live[-1] + 1)
        behind = await follower._missed_some(nc, layout, nodes, live[-1])
    finally:
        await nc.close()
    assert "command" in [kind for s, kind in seen if s < live[0]]  # the replay reads all
    assert [(s, k) for s, k in seen if s > live[0] - 2] == [(s, "node") for s in live]
    assert head > live[-1]  # the refusal's marker
    assert not missed  # only that marker lies past the last node event
    assert behind  # the last node event lies past the one before it
