"""Direct Get reads every stored message, whatever headers it carries: a stored message with
a `Status` header (a stray reply that landed on an aggregate's subject) once ended the page
there, and every read of that aggregate silently stopped short; one with an empty body and a
503 status is a message, not "no responders" (nats-py's `request` takes it for that)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError, SlowConsumerError
from structlog.testing import capture_logs

from events.jetstream.connect import connect
from events.jetstream.directget import (
    LOST_ASKS,
    MULTI_LAST_MAX,
    LastLookups,
    MessagesLost,
    last_on,
    read_all,
)
from events.jetstream.requests import requests
from events.jetstream.streams import ensure_all
from events.jetstream.transient import is_transient
from events.language.subjects import Layout


@pytest.fixture
async def events_log(nats_url: str, prefix: str) -> AsyncIterator[tuple[Client, Layout]]:
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-directget")
    try:
        await ensure_all(nc.jetstream(), layout)
        yield nc, layout
    finally:
        await nc.close()


async def test_a_stored_status_header_does_not_end_the_read(
        events_log: tuple[Client, Layout]) -> None:
    nc, layout = events_log
    js = nc.jetstream()
    subject = layout.aggregate_subject("vm.default.web")
    await js.publish(subject, b"1")
    await js.publish(subject, b"2", headers={"Status": "204"})
    await js.publish(subject, b"3")
    assert [m.data for m in await read_all(nc, layout.events_stream, subject)] == [
        b"1", b"2", b"3"]


async def test_a_stored_503_status_is_a_message_not_no_responders(
        events_log: tuple[Client, Layout]) -> None:
    nc, layout = events_log
    subject = layout.aggregate_subject("vm.default.web")
    await nc.jetstream().publish(subject, b"", headers={"Status": "503"})  # a stray, empty
    found = await last_on(nc, layout.events_stream, subject)
    assert found is not None and found.headers and found.headers["Status"] == "503"


async def test_look_ups_of_one_turn_are_asked_together_each_answered_for_its_subject(
        events_log: tuple[Client, Layout]) -> None:
    """The write path's marker look-ups: one request per `MULTI_LAST_MAX` subjects of a
    turn, not one each, and still each look-up's own answer (a stray on a subject is its
    newest message all the same)."""
    nc, layout = events_log
    js = nc.jetstream()
    subjects = [layout.aggregate_subject(f"command._.c{i}") for i in range(MULTI_LAST_MAX + 50)]
    for i, subject in enumerate(subjects[::3]):
        await js.publish(subject, b"first")
        await js.publish(subject, f"newest {i}".encode(),
                         headers={"Status": "404"} if i == 1 else None)
    asked: list[bytes] = []

    async def count(msg: Msg) -> None:
        asked.append(msg.data)

    watcher = await nc.subscribe(f"$JS.API.DIRECT.GET.{layout.events_stream}", cb=count)
    await nc.flush()
    lookups = LastLookups(nc, layout.events_stream)
    found = await asyncio.gather(*[lookups.last_on(s) for s in subjects],
                                 lookups.last_on(subjects[0]))
    await nc.flush()
    await watcher.unsubscribe()

    newest = {s: f"newest {i}".encode() for i, s in enumerate(subjects[::3])}
    assert [m.data if m is not None else None for m in found] == [
        *[newest.get(s) for s in subjects], newest[subjects[0]]]
    assert len(asked) == 2  # MULTI_LAST_MAX + 50 subjects: two requests


async def test_a_failed_look_up_request_fails_every_look_up_of_it(
        events_log: tuple[Client, Layout]) -> None:
    nc, _layout = events_log
    lookups = LastLookups(nc, "NO_SUCH_STREAM")
    found = await asyncio.gather(lookups.last_on("a.b"), lookups.last_on("a.c"),
                                 return_exceptions=True)
    assert [type(e) for e in found] == [NoRespondersError, NoRespondersError]


async def test_a_look_up_given_up_by_its_caller_leaves_the_others_answered(
        events_log: tuple[Client, Layout]) -> None:
    nc, layout = events_log
    subject = layout.aggregate_subject("command._.kept")
    await nc.jetstream().publish(subject, b"marker")
    lookups = LastLookups(nc, layout.events_stream)
    given_up = lookups.last_on(layout.aggregate_subject("command._.gone"))
    kept = lookups.last_on(subject)
    given_up.cancel()
    found = await kept
    assert found is not None and found.data == b"marker"


LARGE = b"x" * 1_000_000
"""About the largest message the test server takes: 70 of them are past the 64 MB a batched
Direct Get sends before the server ends it early."""


async def test_a_page_the_server_cut_short_is_read_on_not_taken_for_the_log_s_end(
        events_log: tuple[Client, Layout]) -> None:
    nc, layout = events_log
    subject = layout.aggregate_subject("vm.default.large")
    for _ in range(70):
        await nc.jetstream().publish(subject, LARGE)
    assert len(await read_all(nc, layout.events_stream, subject)) == 70


async def test_look_ups_the_server_answered_in_part_are_asked_on(
        events_log: tuple[Client, Layout]) -> None:
    nc, layout = events_log
    subjects = [layout.aggregate_subject(f"command._.large{i}") for i in range(70)]
    for subject in subjects:
        await nc.jetstream().publish(subject, LARGE)
    lookups = LastLookups(nc, layout.events_stream)
    found = await asyncio.gather(*[lookups.last_on(s) for s in subjects])
    assert all(m is not None and m.data == LARGE for m in found)


SMALL = b"y" * 100


async def starved(nats_url: str, stream: str, room: int = 10 * len(SMALL), *,
                  counted: bool = True) -> tuple[Client, list[Exception]]:
    """A connection whose one request inbox drops what arrives while `room` bytes (ten
    small messages) wait there (a slow consumer: nats-py drops rather than queue past a
    subscription's pending limit), and the slow-consumer errors it reports (if `counted`;
    else the connection logs them itself). nats-py sets a subscription's limits only when
    it is made, so the inbox's is lowered in place once a request made it."""
    dropped: list[Exception] = []

    async def note(error: Exception) -> None:
        if isinstance(error, SlowConsumerError):
            dropped.append(error)

    nc = await (connect(nats_url, "test-directget-starved", error_cb=note) if counted
                else connect(nats_url, "test-directget-starved"))
    await last_on(nc, stream, "no.such.subject")  # the inbox is made by the first request
    [inbox] = [sub for sub in nc._subs.values()
               if getattr(sub._cb, "__self__", None) is requests(nc)]
    inbox._pending_bytes_limit = room
    return nc, dropped


async def test_a_message_a_slow_consumer_dropped_is_asked_again_not_taken_for_the_end(
        events_log: tuple[Client, Layout], nats_url: str) -> None:
    nc, layout = events_log
    subject = layout.aggregate_subject("vm.default.many")
    for i in range(400):
        await nc.jetstream().publish(subject, SMALL, headers={"n": str(i)})
    reader, dropped = await starved(nats_url, layout.events_stream)
    try:
        read = await read_all(reader, layout.events_stream, subject)
    finally:
        await reader.close()
    assert dropped  # the answers did lose messages on the way
    assert [int((m.headers or {})["n"]) for m in read] == list(range(400))


async def test_a_look_up_whose_answer_a_slow_consumer_dropped_is_asked_again(
        events_log: tuple[Client, Layout], nats_url: str) -> None:
    """A look-up answered "none" for a marker that is there would let a command delivered
    again be decided again."""
    nc, layout = events_log
    subjects = [layout.aggregate_subject(f"command._.m{i}") for i in range(MULTI_LAST_MAX)]
    for subject in subjects:
        await nc.jetstream().publish(subject, SMALL)
    reader, dropped = await starved(nats_url, layout.events_stream)
    try:
        lookups = LastLookups(reader, layout.events_stream)
        found = await asyncio.gather(*[lookups.last_on(s) for s in subjects])
    finally:
        await reader.close()
    assert dropped
    assert [m is not None and m.data == SMALL for m in found] == [True] * len(subjects)


async def test_answers_that_keep_losing_their_first_message_end_in_a_transient_error(
        events_log: tuple[Client, Layout], nats_url: str) -> None:
    """An inbox with no room for one message loses every stored message of every answer
    (the ends, empty, still arrive): the read asks `LOST_ASKS` times, then raises what a
    retrying caller takes as transient; never an empty page or "none"."""
    nc, layout = events_log
    subject = layout.aggregate_subject("command._.lost")
    await nc.jetstream().publish(subject, SMALL)
    asked: list[bytes] = []

    async def count(msg: Msg) -> None:
        asked.append(msg.data)

    watcher = await nc.subscribe(f"$JS.API.DIRECT.GET.{layout.events_stream}", cb=count)
    await nc.flush()
    reader, dropped = await starved(nats_url, layout.events_stream, room=len(SMALL) // 2)
    try:
        with pytest.raises(MessagesLost) as read:
            await read_all(reader, layout.events_stream, subject)
        with pytest.raises(MessagesLost) as looked_up:
            await LastLookups(reader, layout.events_stream).last_on(subject)
    finally:
        await reader.close()
    await nc.flush()
    await watcher.unsubscribe()
    assert is_transient(read.value) and is_transient(looked_up.value)
    assert len(asked) == 1 + 2 * LOST_ASKS  # the request that made the inbox, then each read's
    assert len(dropped) == 2 * LOST_ASKS


async def test_messages_dropped_by_a_slow_consumer_are_logged_in_lines_of_tens(
        events_log: tuple[Client, Layout], nats_url: str) -> None:
    """Drops come in bursts on a loop already too busy: a line at the 1st, 10th, 100th...,
    each with the total, not a line per message."""
    nc, layout = events_log
    subject = layout.aggregate_subject("vm.default.logged")
    for _ in range(400):
        await nc.jetstream().publish(subject, SMALL)
    reader, _ = await starved(nats_url, layout.events_stream, counted=False)
    try:
        with capture_logs() as logs:
            assert len(await read_all(reader, layout.events_stream, subject)) == 400
    finally:
        await reader.close()
    totals = [line["dropped_total"] for line in logs
              if line["event"].startswith("NATS dropped messages")]
    assert len(totals) >= 2  # ten drops at least, in two lines
    assert totals == [10 ** i for i in range(len(totals))]
