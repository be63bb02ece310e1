"""The library's own recorder test cases, run against events.jetstream on a real nats-server."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    ProcessRecorder,
    StoredEvent,
    TrackingRecorder,
)
from eventsourcing.tests.persistence import (
    AggregateRecorderTestCase,
    ApplicationRecorderTestCase,
    InfrastructureFactoryTestCase,
    NonInterleavingNotificationIDsBaseCase,
    ProcessRecorderTestCase,
    TrackingRecorderTestCase,
)
from eventsourcing.utils import Environment
from nats.js.api import KeyValueConfig

from events.jetstream.connect import connect
from events.jetstream.store import (
    JetStreamAggregateRecorder,
    JetStreamApplicationRecorder,
    JetStreamFactory,
    JetStreamProcessRecorder,
    JetStreamTrackingRecorder,
)
from events.jetstream.streams import events_stream_config
from events.language.subjects import Layout
from tests.natsserver import shared_server


class _FreshStore:
    """Each test gets its own prefix, so its own streams: sequences start at 1."""

    def setUp(self) -> None:
        self.factory = JetStreamFactory(Environment(env={
            "NATS_URL": shared_server().url,
            "VIRTBUS_PREFIX": "t" + uuid.uuid4().hex[:12],
        }))
        super().setUp()  # type: ignore[misc]

    def tearDown(self) -> None:
        super().tearDown()  # type: ignore[misc]
        self.factory.close()


class TestAggregateRecorder(_FreshStore, AggregateRecorderTestCase):
    def create_recorder(self) -> AggregateRecorder:
        return self.factory.aggregate_recorder()

    def test_snapshots_live_apart(self) -> None:
        snapshots = self.factory.aggregate_recorder("snapshots")
        assert isinstance(snapshots, JetStreamAggregateRecorder)
        assert snapshots.space.stream.endswith("_SNAPSHOTS")


class TestApplicationRecorder(_FreshStore, ApplicationRecorderTestCase[ApplicationRecorder]):
    def create_recorder(self) -> ApplicationRecorder:
        return self.factory.application_recorder()

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


class TestNonInterleavingNotificationIDs(_FreshStore, NonInterleavingNotificationIDsBaseCase):
    def create_recorder(self) -> ApplicationRecorder:
        return self.factory.application_recorder()


class TestTrackingRecorder(_FreshStore, TrackingRecorderTestCase):
    def create_recorder(self) -> TrackingRecorder:
        return self.factory.tracking_recorder()


class TestProcessRecorder(_FreshStore, ProcessRecorderTestCase):
    def create_recorder(self) -> ProcessRecorder:
        return self.factory.process_recorder()


class _CustomTrackingRecorder(JetStreamTrackingRecorder):
    pass


class TestFactory(InfrastructureFactoryTestCase[JetStreamFactory]):
    def setUp(self) -> None:
        self.env = Environment("TestCase", {
            InfrastructureFactory.PERSISTENCE_MODULE: "events.jetstream",
            "NATS_URL": shared_server().url,
            "VIRTBUS_PREFIX": "t" + uuid.uuid4().hex[:12],
        })
        super().setUp()

    def expected_factory_class(self) -> type[JetStreamFactory]:
        return JetStreamFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return JetStreamAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return JetStreamApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return JetStreamTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return _CustomTrackingRecorder

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return JetStreamProcessRecorder


def test_environment_selects_module(nats_url: str, prefix: str) -> None:
    env: dict[str, Any] = dict(os.environ)
    env.update({"PERSISTENCE_MODULE": "events.jetstream", "NATS_URL": nats_url,
                "VIRTBUS_PREFIX": prefix})
    factory = InfrastructureFactory.construct(Environment(env=env))
    try:
        assert isinstance(factory, JetStreamFactory)
        assert factory.datastore.layout.prefix == prefix
    finally:
        factory.close()


def test_the_store_leaves_an_installations_streams_and_buckets_as_configured(
        nats_url: str, prefix: str) -> None:
    """`ensure_all` owns the settings (an R3 events stream was scaled down to R1 by the
    control plane's own writer); the store only creates what is missing."""
    layout = Layout(prefix)

    async def install() -> None:
        nc = await connect(nats_url, "installer")
        js = nc.jetstream()
        config = events_stream_config(layout)
        config.description = "as the installation configured it"
        await js.add_stream(config)
        await js.create_key_value(KeyValueConfig(bucket=layout.checkpoints_bucket, history=3))
        await nc.close()

    asyncio.run(install())
    factory = JetStreamFactory(Environment(env={"NATS_URL": nats_url, "VIRTBUS_PREFIX": prefix}))
    try:
        factory.application_recorder()
        factory.tracking_recorder()
        ds = factory.datastore
        info = ds.bridge.run(ds.js.stream_info(layout.events_stream))
        assert info.config.description == "as the installation configured it"
    finally:
        factory.close()


def test_an_append_answers_its_events_sequences_in_the_callers_order(
        nats_url: str, prefix: str) -> None:
    """Events of two aggregates, interleaved: each notification id is its own event's (they
    came back grouped by aggregate)."""
    factory = JetStreamFactory(Environment(env={"NATS_URL": nats_url, "VIRTBUS_PREFIX": prefix}))
    try:
        recorder = factory.application_recorder()
        stored = [StoredEvent(originator_id=agg, originator_version=version,
                              topic=f"{agg}-{version}", state=b"")
                  for agg, version in (("a.x.one", 1), ("a.x.two", 1), ("a.x.one", 2))]
        ids = recorder.insert_events(stored)
        assert ids is not None
        by_id = {n.id: n.topic for n in recorder.select_notifications(ids[0], 3)}
        assert [by_id[i] for i in ids] == ["a.x.one-1", "a.x.two-1", "a.x.one-2"]
    finally:
        factory.close()
