"""The event language: stable type names, schema versions upcast on read, JSON for people,
and subject-safe names."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec
import pytest
from eventsourcing.persistence import MapperDeserialisationError, StoredEvent
from eventsourcing.utils import Environment

from events.api.errors import InvalidSpec
from events.jetstream.store import JetStreamFactory
from events.language import codec
from events.language.codec import EVENT_ID_NAMESPACE, EventMapper, decode, event_id
from events.language.kinds.vm import VirtualMachineInstanceScheduled
from events.language.subjects import (
    Layout,
    aggregate_id,
    decode_token,
    encode_token,
    split_aggregate_id,
)

AT = datetime(2026, 11, 21, 10, 2, tzinfo=UTC)


def scheduled_v1(agg: str) -> bytes:
    """A VirtualMachineInstanceScheduled as schema 1 wrote it (`node_name`)."""
    return msgspec.msgpack.encode({
        "originator_id": agg, "originator_version": 2, "timestamp": AT, "actor": "scheduler",
        "correlation_id": "c", "causation_id": "k", "node_name": "node-7"})


def test_an_old_schema_is_upcast_when_read_back_from_the_store(nats_url: str,
                                                               prefix: str) -> None:
    factory = JetStreamFactory(Environment(env={"NATS_URL": nats_url, "VIRTBUS_PREFIX": prefix}))
    try:
        recorder = factory.application_recorder()
        agg = aggregate_id("vmi", "default", "old")
        recorder.insert_events([StoredEvent(originator_id=agg, originator_version=2,
                                            topic="VirtualMachineInstanceScheduled.v1",
                                            state=scheduled_v1(agg))])
        [stored] = recorder.select_events(agg)
        event = EventMapper(transcoder=None).to_domain_event(stored)  # type: ignore[arg-type]
        assert isinstance(event, VirtualMachineInstanceScheduled)
        assert event.node == "node-7" and event.timestamp == AT
        [notification] = recorder.select_notifications(start=None, limit=1)
        assert decode(notification.topic, notification.state) == event
    finally:
        factory.close()


def scheduled(version: int) -> VirtualMachineInstanceScheduled:
    return VirtualMachineInstanceScheduled(
        originator_id="vmi.default.kept", originator_version=version, timestamp=AT,
        actor="a", correlation_id="c", causation_id="k", node="n1")


def test_an_event_this_process_wrote_is_read_back_as_written_once() -> None:
    """`encode_kept`: the first decode of the written bytes hands back the event itself (the
    follower folds the process's own writes without decoding them again); later reads of the
    same bytes decode them, to an equal event."""
    event = scheduled(1)
    data = codec.encode_kept(event)
    assert decode(event.topic(), data) is event
    again = decode(event.topic(), data)
    assert again == event and again is not event


def test_kept_writes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes that never come back (a refused append) do not pile up: past `KEPT_WRITES`,
    the oldest is forgotten and decoded like any stored event."""
    monkeypatch.setattr(codec, "KEPT_WRITES", 2)
    monkeypatch.setattr(codec, "_kept", {})
    written = [scheduled(v) for v in range(1, 4)]
    data = [codec.encode_kept(e) for e in written]
    first = decode(written[0].topic(), data[0])
    assert first == written[0] and first is not written[0]
    assert decode(written[2].topic(), data[2]) is written[2]


def test_current_schema_round_trips_with_a_stable_name_and_id() -> None:
    event = VirtualMachineInstanceScheduled(
        originator_id="vmi.default.x", originator_version=3, timestamp=AT, actor="a",
        correlation_id="c", causation_id="k", node="n1")
    stored = EventMapper(transcoder=None).to_stored_event(event)  # type: ignore[arg-type]
    assert stored.topic == "VirtualMachineInstanceScheduled.v2"
    assert decode(stored.topic, stored.state) == event
    assert (event.TYPE, event.SCHEMA) == ("VirtualMachineInstanceScheduled", 2)
    assert event_id("vmi.default.x", 3) == event.id


@pytest.mark.parametrize(("originator", "version"),
                         [("vmi.default.x", 3), ("VirtualMachine.bench.vm-1", 1), ("ünï", 10**12)])
def test_an_event_id_is_the_uuid5_of_its_position_as_stored_before(originator: str,
                                                                     version: int) -> None:
    """Ids already in logs were `str(uuid5(...))`: the same text, or a retried append of an
    old event would not dedupe."""
    assert event_id(originator, version) == str(
        uuid.uuid5(EVENT_ID_NAMESPACE, f"{originator}:{version}"))


@pytest.mark.parametrize("name", ["web-1", "host.example.com", "Upper", "a b", "ünï", "x*>"])
def test_any_name_becomes_one_subject_token_and_back(name: str) -> None:
    token = encode_token(name)
    assert not any(c in token for c in ". *>") and token
    assert decode_token(token) == name
    agg = aggregate_id("node", "", name)
    assert split_aggregate_id(agg) == ("node", "", name)
    assert len(Layout().aggregate_subject(agg).split(".")) == 5
    layout = Layout("p1")
    assert layout.command_actor(layout.command_subject(name, "vm", "start")) == name


def test_a_prefix_that_would_split_subjects_is_refused() -> None:
    with pytest.raises(InvalidSpec, match="VIRTBUS_PREFIX"):
        Layout("vb.prod")
    assert Layout("vb-prod").events_stream == "VB_PROD_EVENTS"
    one = uuid.UUID(int=1)
    assert Layout().aggregate_subject(one) == f"virtbus.ev.uuid.{one.hex}"


def test_a_newer_schema_is_refused_not_read_as_the_current_one() -> None:
    """A log written by a newer version: its fields may mean something else."""
    event = VirtualMachineInstanceScheduled(
        originator_id="vmi.default.web", originator_version=2, timestamp=datetime.now(UTC),
        actor="user:x", correlation_id="c", causation_id="c", node="n1")
    newer = f"{event.TYPE}.v{event.SCHEMA + 1}"
    with pytest.raises(MapperDeserialisationError, match="newer than this version"):
        decode(newer, codec.encode(event))
