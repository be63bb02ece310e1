"""Nothing reaches the event log but the control plane's appends (issue 8, finding 1).

A request's reply subject is the requester's choice, and whatever answers it publishes there
in the answerer's account: a read-service answer or a JetStream API answer aimed at
`<p>.ev.<object>` was stored in the events stream, for good. So: the read service answers
inboxes only; readers skip whatever is stored there that is no event of that subject,
loudly; the writer appends past it; and the JetStream assets can live in an account the
other roles reach only through imports, where no reply of theirs can land in a stream.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client as Nats
from nats.js.api import StreamInfo

import controlplane.handlers  # noqa: F401  (registers the command handlers)
from controlplane.writeprotocol import CommandHandler
from events.jetstream.connect import connect
from events.jetstream.datastore import TOPIC_HEADER, VERSION_HEADER, EventLog, JetStreamDatastore
from events.jetstream.directget import read_all
from events.jetstream.store import JetStreamApplicationRecorder
from events.jetstream.streams import ensure_all
from events.language.codec import encode
from events.language.kinds.vm import VM_KIND
from events.language.messages import Command
from events.language.query import Answer, Query, query_subject
from events.language.subjects import Layout, aggregate_id
from projections.cluster import ClusterState
from projections.follower import MISPLACED, NO_TOPIC, follow, read_event
from projections.hco import METRICS_QUERY
from projections.http import respond
from projections.kinds.vm import VirtualMachineView
from projections.service import NOT_AN_INBOX, QUERIES_REFUSED, ReadService
from tests.security.conftest import connect_as, serve_config
from tests.system.harness import vm_manifest

WEB = aggregate_id(VM_KIND, "default", "web")
OTHER = aggregate_id(VM_KIND, "default", "other")
API_ANSWER = b'{"type":"io.nats.jetstream.api.v1.stream_info_response"}'
"""What a JetStream API answer aimed at an event subject leaves there: JSON, no headers."""


def command(verb: str, name: str = "web", **fields: object) -> Command:
    return Command(id=str(uuid.uuid4()), actor="user:alice", kind="VirtualMachine",
                   verb=verb, namespace="default", name=name, **fields)  # type: ignore[arg-type]


async def _stored_on(nc: Nats, layout: Layout, subject: str) -> list[bytes]:
    return [m.data for m in await read_all(nc, layout.events_stream, subject)]


# -- the read service ---------------------------------------------------------------------


async def test_read_service_answers_inboxes_only(nats_url: str, prefix: str) -> None:
    """A query whose reply names an event subject is refused unanswered, counted and logged;
    nothing lands in the log; a query from an inbox is still answered."""
    layout = Layout(prefix)
    nc = await connect(nats_url, "test")
    await ensure_all(nc.jetstream(), layout)
    service = ReadService(nc, layout)
    sub = await service.listen()
    asker = await connect(nats_url, "asker")
    target = layout.aggregate_subject(WEB)
    query = msgspec.msgpack.encode(Query(kind="VirtualMachine"))
    await asker.publish(query_subject(layout, "alice"), query, reply=target)
    # One connection, one subscription: the refused query was handled before this one.
    reply = await asker.request(query_subject(layout, "alice"), query, timeout=10)
    assert msgspec.msgpack.decode(reply.data, type=Answer).error == ""

    assert await _stored_on(nc, layout, target) == []
    assert service.registry.get_sample_value(
        f"{QUERIES_REFUSED}_total", {"reason": NOT_AN_INBOX}) == 1
    _, _, scraped = respond(service.state, service.render, "/metrics", service.process_metrics)
    assert f'{QUERIES_REFUSED}_total{{reason="{NOT_AN_INBOX}"}} 1.0' in scraped.decode()
    await sub.unsubscribe()
    await asyncio.gather(nc.close(), asker.close())


# -- readers and the writer, past a stray ---------------------------------------------------


async def _replay(nc: Nats, layout: Layout) -> ClusterState:
    """A fresh read path: the log replayed into a new state, up to its head."""
    state = ClusterState()
    stop = asyncio.Event()

    async def on_event(seq: int, event: object) -> None:
        state.apply(event, seq)  # type: ignore[arg-type]

    async def on_skip(seq: int, reason: str) -> None:
        state.skip(seq, reason)

    async def caught_up() -> None:
        stop.set()

    await follow(nc, layout, on_event, on_skip=on_skip, on_caught_up=caught_up, stop=stop)
    return state


async def test_a_stray_on_an_object_wedges_no_writer_and_no_reader(
        nats_url: str, prefix: str) -> None:
    """A message that is no event, stored on a VM's subject (as a JetStream API answer aimed
    there is), does not stop the next command on that VM, warm or cold; a fresh replay skips
    it with its count in the metrics; the library's recorder reads past it."""
    layout = Layout(prefix)
    nc = await connect(nats_url, "test")
    js = nc.jetstream()
    await ensure_all(js, layout)
    handler = CommandHandler(EventLog(nc, layout))
    created = await handler.execute(command("apply", manifest=vm_manifest("web", "Halted")))
    assert created.outcome.accepted, created.outcome.reason

    stray = (await js.publish(layout.aggregate_subject(WEB), API_ANSWER)).seq
    started = await handler.execute(command("start"))  # its memory has the VM before the stray
    assert started.outcome.accepted, started.outcome.reason
    assert started.outcome.sequences[0] > stray

    second = (await js.publish(layout.aggregate_subject(WEB), API_ANSWER)).seq
    cold = CommandHandler(EventLog(nc, layout))  # a restarted control plane: reads the VM
    stopped = await cold.execute(command("stop"))
    assert stopped.outcome.accepted, stopped.outcome.reason
    assert stopped.outcome.sequences[0] > second

    state = await _replay(nc, layout)
    assert state.skipped == {NO_TOPIC: 2}
    view = state.views[WEB]
    assert isinstance(view, VirtualMachineView) and view.run_strategy == "Halted"
    [metrics] = ReadService(nc, layout).render(state, Query(kind=METRICS_QUERY))
    assert f'virtbus_events_skipped_total{{reason="{NO_TOPIC}"}} 2.0' in metrics["text"]

    last = (await js.publish(layout.aggregate_subject(WEB), API_ANSWER)).seq

    def library_reads() -> tuple[list[int], list[int], tuple[int, int] | None]:
        datastore = JetStreamDatastore(nats_url, layout)
        try:
            recorder = JetStreamApplicationRecorder(datastore)
            versions = [e.originator_version for e in recorder.select_events(WEB)]
            ids = [n.id for n in recorder.select_notifications(1, 100)]
            position = recorder.last_position(WEB)  # what the library's next append expects
            return versions, ids, position
        finally:
            datastore.close()

    versions, ids, position = await asyncio.to_thread(library_reads)
    assert versions == [1, 2, 3]  # created, start, stop
    assert position == (3, last)
    assert stray not in ids and second not in ids and started.outcome.sequences[0] in ids
    await nc.close()


async def test_an_event_copied_onto_another_subject_is_skipped(
        nats_url: str, prefix: str) -> None:
    """A Direct Get answer aimed at another object's subject stores a copy of a real event
    there (outside the dedupe window, or of an event with no id): readers skip it as
    misplaced, so the other object does not come to exist from it."""
    layout = Layout(prefix)
    nc = await connect(nats_url, "test")
    js = nc.jetstream()
    await ensure_all(js, layout)
    handler = CommandHandler(EventLog(nc, layout))
    created = await handler.execute(command("apply", manifest=vm_manifest("web", "Halted")))
    assert created.outcome.accepted, created.outcome.reason
    [original] = await read_all(nc, layout.events_stream, layout.aggregate_subject(WEB))
    event = read_event(original)
    assert event is not None
    headers = {TOPIC_HEADER: event.topic(), VERSION_HEADER: "1"}  # as a copy carries them
    await js.publish(layout.aggregate_subject(OTHER), encode(event), headers=headers)

    refused = await CommandHandler(EventLog(nc, layout)).execute(command("start", "other"))
    assert not refused.outcome.accepted
    assert '"default/other" not found' in refused.outcome.reason
    state = await _replay(nc, layout)
    assert state.skipped == {MISPLACED: 1}
    assert OTHER not in state.views
    await nc.close()


# -- the JetStream API path: the assets in an account of their own ---------------------------

SPLIT_ACCOUNTS = """
# Prototype: the JetStream assets in STORE, which only the control plane and the read service
# log in to; people and node agents in USERS, reaching STORE through imports. A request that
# crosses an import has its reply mapped to a `_R_.` subject in STORE, and the answer goes
# back to the requester's account: no reply of theirs can land in STORE's streams.
accounts {
  STORE {
    jetstream: enabled
    users: [
      { user: controlplane, password: $VIRTBUS_NATS_CONTROLPLANE_PASSWORD }
      { user: projections, password: $VIRTBUS_NATS_PROJECTIONS_PASSWORD,
        permissions: { publish: { allow: ["_INBOX.>", "_R_.>", "$JS.API.>"],
                                  deny: ["virtbus.>"] },
                       subscribe: { allow: ["_INBOX.projections.>", "virtbus.query.>"] } } }
    ]
    exports: [
      { service: "virtbus.cmd.>" }
      { service: "virtbus.query.>" }
      { service: "$JS.API.INFO" }
      { service: "$JS.API.STREAM.NAMES" }
      { service: "$JS.API.STREAM.INFO.VIRTBUS_EVENTS" }
      { service: "$JS.API.DIRECT.GET.VIRTBUS_EVENTS", response_type: stream }
      { service: "$JS.API.DIRECT.GET.VIRTBUS_EVENTS.>", response_type: stream }
      { service: "$JS.API.CONSUMER.CREATE.VIRTBUS_EVENTS" }
      { service: "$JS.API.CONSUMER.CREATE.VIRTBUS_EVENTS.>" }
      { service: "$JS.API.CONSUMER.DELETE.VIRTBUS_EVENTS.>" }
      { service: "$JS.API.CONSUMER.INFO.VIRTBUS_EVENTS.>" }
      { service: "$JS.FC.VIRTBUS_EVENTS.>" }
      { stream: "_INBOX.alice.>" }
    ]
  }
  USERS {
    users: [ { user: alice, password: $VIRTBUS_NATS_ALICE_PASSWORD } ]
    imports: [
      { service: { account: STORE, subject: "virtbus.cmd.>" } }
      { service: { account: STORE, subject: "virtbus.query.>" } }
      { service: { account: STORE, subject: "$JS.API.INFO" } }
      { service: { account: STORE, subject: "$JS.API.STREAM.NAMES" } }
      { service: { account: STORE, subject: "$JS.API.STREAM.INFO.VIRTBUS_EVENTS" } }
      { service: { account: STORE, subject: "$JS.API.DIRECT.GET.VIRTBUS_EVENTS" } }
      { service: { account: STORE, subject: "$JS.API.DIRECT.GET.VIRTBUS_EVENTS.>" } }
      { service: { account: STORE, subject: "$JS.API.CONSUMER.CREATE.VIRTBUS_EVENTS" } }
      { service: { account: STORE, subject: "$JS.API.CONSUMER.CREATE.VIRTBUS_EVENTS.>" } }
      { service: { account: STORE, subject: "$JS.API.CONSUMER.DELETE.VIRTBUS_EVENTS.>" } }
      { service: { account: STORE, subject: "$JS.API.CONSUMER.INFO.VIRTBUS_EVENTS.>" } }
      { service: { account: STORE, subject: "$JS.FC.VIRTBUS_EVENTS.>" } }
      { stream: { account: STORE, subject: "_INBOX.alice.>" } }
    ]
  }
}
"""


@pytest.fixture
def split_nats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from serve_config(tmp_path, monkeypatch, SPLIT_ACCOUNTS)


async def _events_info(nc: Nats, layout: Layout) -> StreamInfo:
    return await nc.jetstream().stream_info(layout.events_stream)


async def test_split_accounts_keep_every_answer_out_of_the_log(split_nats: str) -> None:
    """With the JetStream assets in an account of their own: the control plane appends
    (atomic batch, expected sequences); a user in another account commands, queries, reads
    events by Direct Get and follows them; and no answer it aims at an event subject — the
    read service's, a JetStream API's, a Direct Get's — lands in the log."""
    layout = Layout()
    cp, _ = await connect_as(split_nats, "controlplane")
    await ensure_all(cp.jetstream(), layout)
    handler = CommandHandler(EventLog(cp, layout))
    created = await handler.execute(command("apply", manifest=vm_manifest("web", "Halted")))
    assert created.outcome.accepted, created.outcome.reason
    started = await handler.execute(command("start"))  # expects the VM's last sequence
    assert started.outcome.accepted, started.outcome.reason

    proj, _ = await connect_as(split_nats, "projections")
    service = ReadService(proj, layout)
    sub = await service.listen()
    alice, refusals = await connect_as(split_nats, "alice")
    ajs = alice.jetstream(timeout=5)

    ack = await ajs.publish(layout.command_subject("alice", "vm", "stop"), b"{}")
    assert ack.stream == layout.commands_stream
    query = msgspec.msgpack.encode(Query(kind="VirtualMachine"))
    reply = await alice.request(query_subject(layout, "alice"), query, timeout=10)
    assert msgspec.msgpack.decode(reply.data, type=Answer).error == ""
    web = layout.aggregate_subject(WEB)
    assert len(await read_all(alice, layout.events_stream, web)) == 2
    follow_sub = await ajs.subscribe(layout.events_filter(), ordered_consumer=True)
    assert read_event(await follow_sub.next_msg(timeout=10)) is not None
    await follow_sub.unsubscribe()

    before = (await _events_info(cp, layout)).state.last_seq
    attacks = [
        (query_subject(layout, "alice"), query),
        (f"$JS.API.STREAM.INFO.{layout.events_stream}", b""),
        (f"$JS.API.DIRECT.GET.{layout.events_stream}", b'{"seq": 1}'),
    ]
    for subject, body in attacks:
        await alice.publish(subject, body, reply=web)
    # Each answer went back to alice's account, on the subject she named: she sees it there
    # (were she subscribed), and STORE's streams never do. A final round trip orders them.
    await alice.request(f"$JS.API.STREAM.INFO.{layout.events_stream}", b"", timeout=5)
    await proj.flush()
    assert (await _events_info(cp, layout)).state.last_seq == before
    refused = service.registry.get_sample_value(f"{QUERIES_REFUSED}_total",
                                                {"reason": NOT_AN_INBOX})
    assert refused is None  # never counted: the reply the service saw was a mapped `_R_.`
    assert refusals == []
    await sub.unsubscribe()
    await asyncio.gather(cp.close(), proj.close(), alice.close())
