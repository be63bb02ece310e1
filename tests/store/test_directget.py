"""Direct Get reads every stored message, whatever headers it carries: a stored message with
a `Status` header (a stray reply that landed on an aggregate's subject) once ended the page
there, and every read of that aggregate silently stopped short; one with an empty body and a
503 status is a message, not "no responders" (nats-py's `request` takes it for that)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from events.connect import connect
from events.directget import last_on, read_all
from events.streams import ensure_all
from events.subjects import Layout


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
