"""Batched Direct Get reads every stored message, whatever headers it carries: a stored
message with a `Status` header (a stray reply that landed on an aggregate's subject) once
ended the page there, and every read of that aggregate silently stopped short."""

from __future__ import annotations

from events.connect import connect
from events.directget import read_all
from events.streams import ensure_all
from events.subjects import Layout


async def test_a_stored_status_header_does_not_end_the_read(nats_url: str, prefix: str) -> None:
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-directget")
    try:
        js = nc.jetstream()
        await ensure_all(js, layout)
        subject = layout.aggregate_subject("vm.default.web")
        await js.publish(subject, b"1")
        await js.publish(subject, b"2", headers={"Status": "204"})
        await js.publish(subject, b"3")
        assert [m.data for m in await read_all(nc, layout.events_stream, subject)] == [
            b"1", b"2", b"3"]
    finally:
        await nc.close()
