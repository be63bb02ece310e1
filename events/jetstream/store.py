"""An `eventsourcing` persistence module on NATS JetStream.

Select it with `PERSISTENCE_MODULE=events.jetstream`; it reads `NATS_URL` (default
`nats://127.0.0.1:4222`) and `VIRTBUS_PREFIX` (default `virtbus`). A sibling of the library's
`popo.py` and `sqlite.py`:

- an aggregate's events are messages on `<p>.ev.<aggregate id>` in the `<P>_EVENTS` stream;
  the notification id of an event is its stream sequence;
- an append carries `Nats-Expected-Last-Subject-Sequence` for each aggregate it touches, so a
  stale version is refused by the server and surfaces as the library's `IntegrityError`;
- a multi-event append is one JetStream atomic batch: all of it is stored, or none;
- reads use batched Direct Get, so replay costs one request per page, not per event;
- process applications' positions (`Tracking`) live on `<p>.trk.<app>` in the same stream and
  commit in the same batch as the events they caused; plain tracking recorders use a KV bucket.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import structlog
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    IntegrityError,
    ListenNotifySubscription,
    Notification,
    ProcessRecorder,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)
from eventsourcing.utils import Environment, resolve_topic
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy, KeyValueConfig
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from events.jetstream.connect import DEFAULT_URL
from events.jetstream.datastore import (
    MAX_APPEND_ATTEMPTS,
    NO_VERSION,
    TOPIC_HEADER,
    JetStreamDatastore,
    StreamSpace,
)
from events.jetstream.directget import PAGE, sequence
from events.jetstream.streams import create_key, get_key
from events.language.subjects import (
    DEFAULT_PREFIX,
    Layout,
    aggregate_subject,
    encode_token,
    originator_of,
)

log = structlog.get_logger(__name__)


def _stored_event(ds: JetStreamDatastore, root: str, msg: Msg) -> StoredEvent | None:
    """The stored event in `msg`, or None, logged, for anything else stored among events (a
    reply aimed at an event subject, a copy of another aggregate's event): readers go past."""
    headers = msg.headers or {}
    version = ds.written_version(msg)
    topic = headers.get(TOPIC_HEADER)
    if version is None or topic is None:
        log.warning("skipped an entry of the log that is no stored event",
                    subject=headers.get("Nats-Subject"), sequence=headers.get("Nats-Sequence"),
                    topic=topic, size=len(msg.data))
        return None
    return StoredEvent(
        originator_id=originator_of(root, headers["Nats-Subject"]),
        originator_version=version,
        topic=topic,
        state=msg.data,
    )


class JetStreamAggregateRecorder(AggregateRecorder):
    def __init__(self, datastore: JetStreamDatastore, space: StreamSpace) -> None:
        self.datastore = datastore
        self.space = space
        datastore.ensure(space)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        self._insert(stored_events, **kwargs)
        return None

    def _insert(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> list[int]:
        tracking: Tracking | None = kwargs.get("tracking")
        if not stored_events and tracking is None:
            return []
        return self.datastore.bridge.run(
            self.datastore.append(self.space, stored_events, tracking)
        )

    def last_position(self, originator_id: uuid.UUID | str) -> tuple[int, int] | None:
        """(version, stream sequence) of an aggregate's newest event, read from the server."""
        subject = aggregate_subject(self.space.root, originator_id)
        return self.datastore.bridge.run(self.datastore.refresh(self.space.stream, subject))

    def aggregate_ids(self, kind: str) -> list[str]:
        """Every aggregate of one kind (`<kind>.<namespace>.<name>`) that has events, deleted
        ones included: for deciders that must look at all objects of a kind."""
        root = self.space.root
        subjects = self.datastore.bridge.run(
            self.datastore.subjects(self.space.stream, f"{root}.{kind}.>"))
        return [subject[len(root) + 1:] for subject in subjects]

    def select_events(
        self,
        originator_id: uuid.UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        return self.datastore.bridge.run(
            self._select_events(originator_id, gt, lte, desc, limit)
        )

    async def _select_events(
        self,
        originator_id: uuid.UUID | str,
        gt: int | None,
        lte: int | None,
        desc: bool,
        limit: int | None,
    ) -> list[StoredEvent]:
        ds, root = self.datastore, self.space.root
        subject = aggregate_subject(root, originator_id)
        if desc and limit == 1 and lte is None:
            msg = await ds.last_on(self.space.stream, subject)
            if msg is None:
                return []
            last = _stored_event(ds, root, msg)
            if last is not None:
                ds.remember(subject, last.originator_version, sequence(msg))
                return [last] if gt is None or last.originator_version > gt else []
        msgs = await ds.read_all(self.space.stream, subject)
        events = [e for e in (_stored_event(ds, root, msg) for msg in msgs) if e is not None]
        if events:  # the newest version, and the subject's last sequence, stray or not
            ds.remember(subject, events[-1].originator_version, sequence(msgs[-1]))
        selected = [
            e for e in events
            if (gt is None or e.originator_version > gt)
            and (lte is None or e.originator_version <= lte)
        ]
        if desc:
            selected.reverse()
        return selected[:limit] if limit is not None else selected


class JetStreamApplicationRecorder(JetStreamAggregateRecorder, ApplicationRecorder):
    def __init__(self, datastore: JetStreamDatastore, space: StreamSpace | None = None) -> None:
        super().__init__(datastore, space or datastore.events)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        return self._insert(stored_events, **kwargs)

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        first = 1 if start is None else (start if inclusive_of_start else start + 1)
        return self.datastore.bridge.run(self.read(first, limit, stop, topics))

    async def read(
        self, first: int, limit: int, stop: int | None = None, topics: Sequence[str] = ()
    ) -> list[Notification]:
        """Notifications from sequence `first` on; the async core of select_notifications."""
        ds, root = self.datastore, self.space.root
        wanted = set(topics)
        out: list[Notification] = []
        start = max(first, 1)
        subject = f"{root}.>"
        while len(out) < limit and (stop is None or start <= stop):
            page_size = PAGE if wanted else min(PAGE, limit - len(out))
            if stop is not None:
                page_size = min(page_size, stop - start + 1)
            page = await ds.direct_batch(self.space.stream, start, page_size, subject)
            for msg in page:
                headers = msg.headers or {}
                seq = int(headers["Nats-Sequence"])
                if stop is not None and seq > stop:
                    return out
                stored = _stored_event(ds, root, msg)
                if stored is None or (wanted and stored.topic not in wanted):
                    continue
                out.append(Notification(
                    id=seq,
                    originator_id=stored.originator_id,
                    originator_version=stored.originator_version,
                    topic=stored.topic,
                    state=stored.state,
                ))
                if len(out) == limit:
                    return out
            if len(page) < page_size:
                return out
            start = sequence(page[-1]) + 1
        return out

    def max_notification_id(self) -> int | None:
        msg = self.datastore.bridge.run(
            self.datastore.last_on(self.space.stream, f"{self.space.root}.>")
        )
        return None if msg is None else sequence(msg)

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        return JetStreamSubscription(recorder=self, gt=gt, topics=topics)


class JetStreamSubscription(ListenNotifySubscription[JetStreamApplicationRecorder]):
    """Follows new events: a headers-only ordered consumer wakes the library's pull loop.

    A JetStream consumer (not a core subscription) is the wake-up, because it delivers only
    after the server has stored a message; a core subscriber can hear a batch's commit before
    the batch is readable and would then sleep through it.
    """

    def __init__(
        self,
        recorder: JetStreamApplicationRecorder,
        gt: int | None = None,
        topics: Sequence[str] = (),
    ) -> None:
        bridge = recorder.datastore.bridge

        async def wake(_msg: Msg) -> None:
            notified: threading.Event | None = getattr(self, "_has_been_notified", None)
            if notified is not None:
                notified.set()

        self._wakeup = bridge.run(recorder.datastore.js.subscribe(
            f"{recorder.space.root}.>", cb=wake, ordered_consumer=True, headers_only=True,
            deliver_policy=DeliverPolicy.NEW,
        ))
        super().__init__(recorder=recorder, gt=gt, topics=topics)

    def stop(self) -> None:
        super().stop()
        bridge = self._recorder.datastore.bridge
        if not bridge.loop.is_closed():
            with contextlib.suppress(Exception):
                bridge.run(self._wakeup.unsubscribe())


class JetStreamTrackingRecorder(TrackingRecorder):
    """Positions of projections, one KV key per application, compare-and-set on update."""

    def __init__(self, datastore: JetStreamDatastore) -> None:
        self.datastore = datastore
        self._kv = datastore.bridge.run(self._bucket())

    async def _bucket(self) -> KeyValue:
        """The checkpoints bucket, created only if missing: an existing one keeps the
        configuration `ensure_all` gave it (creating it again with other replicas fails)."""
        js, bucket = self.datastore.js, self.datastore.layout.checkpoints_bucket
        try:
            return await js.key_value(bucket)
        except BucketNotFoundError:
            return await js.create_key_value(KeyValueConfig(bucket=bucket))

    def insert_tracking(self, tracking: Tracking) -> None:
        self.datastore.bridge.run(self._insert_tracking(tracking))

    async def _insert_tracking(self, tracking: Tracking) -> None:
        key = encode_token(tracking.application_name)
        for _attempt in range(MAX_APPEND_ATTEMPTS):
            entry = await get_key(self._kv, key)
            current = int(entry.value or b"0") if entry is not None else None
            if current is not None and current >= tracking.notification_id:
                raise IntegrityError(
                    f"tracking {tracking.application_name} is at {current}, "
                    f"not below {tracking.notification_id}"
                )
            value = str(tracking.notification_id).encode()
            if entry is None:
                if await create_key(self._kv, key, value) is not None:
                    return
                continue
            try:
                await self._kv.update(key, value, last=entry.revision)
                return
            except KeyWrongLastSequenceError:
                continue
        raise IntegrityError("tracking kept racing a concurrent writer")

    def max_tracking_id(self, application_name: str) -> int | None:
        return self.datastore.bridge.run(self._max_tracking_id(application_name))

    async def _max_tracking_id(self, application_name: str) -> int | None:
        entry = await get_key(self._kv, encode_token(application_name))
        return int(entry.value or b"0") if entry is not None else None


class JetStreamProcessRecorder(JetStreamApplicationRecorder, ProcessRecorder):
    """Events and the position they were caused from, in one atomic batch."""

    def insert_tracking(self, tracking: Tracking) -> None:
        self._insert([], tracking=tracking)

    def max_tracking_id(self, application_name: str) -> int | None:
        subject = self.datastore.layout.tracking_subject(application_name)
        last = self.datastore.bridge.run(self.datastore.refresh(self.space.stream, subject))
        return None if last is None or last[0] == NO_VERSION else last[0]


class JetStreamFactory(InfrastructureFactory[JetStreamTrackingRecorder]):
    NATS_URL = "NATS_URL"
    VIRTBUS_PREFIX = "VIRTBUS_PREFIX"

    def __init__(self, env: Environment) -> None:
        super().__init__(env)
        url = self.env.get(self.NATS_URL) or DEFAULT_URL
        prefix = self.env.get(self.VIRTBUS_PREFIX) or DEFAULT_PREFIX
        self.datastore = JetStreamDatastore(url, Layout(prefix))

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        ds = self.datastore
        space = ds.snapshots if purpose == "snapshots" else ds.events
        return JetStreamAggregateRecorder(ds, space)

    def application_recorder(self) -> ApplicationRecorder:
        return JetStreamApplicationRecorder(self.datastore)

    def tracking_recorder(
        self, tracking_recorder_class: type[JetStreamTrackingRecorder] | None = None
    ) -> JetStreamTrackingRecorder:
        if tracking_recorder_class is None:
            topic = self.env.get(self.TRACKING_RECORDER_TOPIC)
            tracking_recorder_class = resolve_topic(topic) if topic else JetStreamTrackingRecorder
        assert tracking_recorder_class is not None
        assert issubclass(tracking_recorder_class, JetStreamTrackingRecorder)
        return tracking_recorder_class(self.datastore)

    def process_recorder(self) -> ProcessRecorder:
        return JetStreamProcessRecorder(self.datastore)

    def close(self) -> None:
        self.datastore.close()
        super().close()


Factory = JetStreamFactory

__all__ = [
    "Factory",
    "JetStreamAggregateRecorder",
    "JetStreamApplicationRecorder",
    "JetStreamFactory",
    "JetStreamProcessRecorder",
    "JetStreamSubscription",
    "JetStreamTrackingRecorder",
]
