"""The JetStream side of the event store: reads, what appends have learned, and the atomic
append itself, in two layers.

`EventLog` is asyncio on the caller's own connection: the control plane's writer publishes
batches through it with exact expectations (`Outgoing.expect`: "this subject's last sequence
is still the one my decision read"), and every answer the server can give is mapped:

| server answer                                    | raised             | the writer then        |
|--------------------------------------------------|--------------------|------------------------|
| 10071 wrong last sequence, 10158 / 10164 a       | `AppendConflict`   | decides again on fresh |
| clustered twin of it, 10201 / duplicate id       |                    | state, or answers the  |
|                                                  |                    | command's first outcome|
| 10210 too many atomic batches in flight          | (retried here, after a short pause)         |
| no ack (timeout, lost connection, no responders) | `OutcomeUnknown`   | settles by the marker  |
| anything else                                    | `PersistenceError` | rejects the command    |

`JetStreamDatastore` adds the synchronous bridge for the `eventsourcing` recorders
(`events.jetstream`); its `append` keeps the library's semantics: versions, with the
expected sequence taken from a cached hint and refreshed when the server says it is stale.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Sequence
from typing import Final

import msgspec
import structlog
from eventsourcing.persistence import (
    IntegrityError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
    Tracking,
)
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError

from events.jetstream.bridge import NatsBridge
from events.jetstream.directget import direct_batch, last_on, read_all, sequence
from events.jetstream.requests import PubAck, decode_pub_ack, request
from events.jetstream.streams import (
    create_stream_if_missing,
    events_stream_config,
    snapshots_stream_config,
)
from events.jetstream.transient import TRANSIENT_API_CODES
from events.language.codec import event_id
from events.language.subjects import Layout, aggregate_subject, decode_token, originator_of

MAX_BATCH: Final = 1000
"""JetStream's limit on messages in one atomic batch."""
MAX_APPEND_ATTEMPTS: Final = 5

ACK_TIMEOUT: Final = 10.0
"""How long an append waits for JetStream's ack before it counts as failed."""
TOPIC_HEADER: Final = "Vb-Topic"
VERSION_HEADER: Final = "Vb-Version"
EXPECTED_SEQUENCE_HEADER: Final = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_SUBJECT_HEADER: Final = "Nats-Expected-Last-Subject-Sequence-Subject"
STALE_SEQUENCE_CODES: Final = frozenset({
    10071,  # wrong last sequence
    10164,  # the clustered form of a wrong last sequence
})
CONFLICT_CODES: Final = STALE_SEQUENCE_CODES | {
    10158,  # duplicate message id is in process (a racing writer, clustered)
    10201,  # atomic batch holds a message id already stored (the version exists)
}
TOO_MANY_INFLIGHT: Final = 10210
INFLIGHT_PAUSE_SECONDS: Final = 0.005
"""How long an append waits before offering a batch the server refused as one too many."""
MAX_INFLIGHT_RETRIES: Final = 400

NO_VERSION: Final = -1
"""The version `refresh` gives a subject holding nothing this store wrote (the library's
first version may be 0)."""

log = structlog.get_logger(__name__)


class AppendConflict(IntegrityError):
    """Something the append expected has changed: a subject moved on (`stale_sequence`), or
    a version it writes exists already (a duplicate id)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.stale_sequence = code in STALE_SEQUENCE_CODES


class OutcomeUnknown(PersistenceError):
    """No answer came for an append: it may or may not be stored. Whoever made it settles
    it by reading (the command's marker), never by assuming either way."""


class Outgoing(msgspec.Struct, frozen=True):
    """One message of an atomic batch. `expect` is the last sequence its subject (or
    `expect_subject`, which may be a wildcard) must still have; None expects nothing."""

    subject: str
    data: bytes
    headers: dict[str, str]
    expect: int | None = None
    expect_subject: str = ""


class StreamSpace(msgspec.Struct, frozen=True):
    """Where one recorder keeps aggregates: a stream and the subject root inside it."""

    stream: str
    root: str


class EventLog:
    """The store on one asyncio NATS connection: reads, and atomic batches.

    `_last` remembers, per subject, the newest (version, sequence) this process has seen, so
    a library append after a read needs no extra round trip. It is only a hint: the server
    checks the expected sequence, and a stale hint costs one refresh, never a wrong write.
    """

    def __init__(self, nc: Client, layout: Layout) -> None:
        self.nc = nc
        self.layout = layout
        self.js = nc.jetstream()
        self._last: dict[str, tuple[int, int]] = {}
        self.events = StreamSpace(layout.events_stream, layout.events_root)
        self.snapshots = StreamSpace(layout.snapshots_stream, layout.snapshots_root)

    # -- reads -------------------------------------------------------------------------

    async def direct_batch(self, stream: str, start: int, limit: int, subject: str) -> list[Msg]:
        return await direct_batch(self.nc, stream, start, limit, subject)

    async def read_all(self, stream: str, subject: str) -> list[Msg]:
        return await read_all(self.nc, stream, subject)

    async def last_on(self, stream: str, subject: str) -> Msg | None:
        return await last_on(self.nc, stream, subject)

    async def subjects(self, stream: str, subject_filter: str) -> list[str]:
        """The subjects holding messages under `subject_filter`, from the stream's state."""
        info = await self.js.stream_info(stream, subjects_filter=subject_filter)
        return sorted(info.state.subjects or {})

    def remember(self, subject: str, version: int, seq: int) -> None:
        last = self._last.get(subject)
        if last is None or last[1] < seq:
            self._last[subject] = (version, seq)

    async def refresh(self, stream: str, subject: str) -> tuple[int, int] | None:
        """(version, sequence) of `subject` as the server holds it: the sequence of its
        newest message, which is what an append must expect, whatever that message is; the
        version of its newest entry this store wrote (`NO_VERSION` if none), read past
        anything else stored there (a stray reply), so a stray never wedges the writer."""
        msg = await self.last_on(stream, subject)
        if msg is None:
            self._last.pop(subject, None)
            return None
        version = self.written_version(msg)
        if version is None:
            log.warning("the newest message on a subject is no entry this store wrote; "
                        "appending past it", subject=subject, sequence=sequence(msg))
            versions = [self.written_version(m) for m in await self.read_all(stream, subject)]
            version = max((v for v in versions if v is not None), default=NO_VERSION)
        last = (version, sequence(msg))
        self._last[subject] = last
        return last

    def written_version(self, msg: Msg) -> int | None:
        """The version of a stored entry this store wrote (an event, a snapshot, a tracking
        record: its id is derived from its subject and version); None for anything else
        stored on its subject: a reply or an API answer aimed there, or a copy of another
        subject's entry that a Direct Get answer put there."""
        headers = msg.headers or {}
        subject = headers.get("Nats-Subject", msg.subject)
        try:
            version = int(headers.get(VERSION_HEADER, ""))
        except ValueError:
            return None
        return version if headers.get("Nats-Msg-Id") == self._written_id(subject, version) \
            else None

    def _written_id(self, subject: str, version: int) -> str:
        tracking_root = f"{self.layout.tracking_root}."
        if subject.startswith(tracking_root):
            return tracking_id(decode_token(subject.removeprefix(tracking_root)), version)
        root = subject.split(".", 2)[:2]
        return event_id(originator_of(".".join(root), subject), version)

    # -- the atomic batch --------------------------------------------------------------

    async def publish(self, messages: Sequence[Outgoing]) -> list[int]:
        """Store `messages` atomically, in their order, each subject's expectation checked
        by the server; their stream sequences. See the module's table for the errors."""
        for _attempt in range(MAX_INFLIGHT_RETRIES):
            ack = await self._send(messages)
            if ack.error is None and not ack.duplicate:
                first = ack.seq - ack.count + 1
                return list(range(first, first + len(messages)))
            code = ack.error.err_code if ack.error else 0
            if ack.duplicate or code in CONFLICT_CODES:
                raise AppendConflict(ack.error.description if ack.error else "duplicate", code)
            if ack.error is not None and (ack.error.code == 503
                                          or code in TRANSIENT_API_CODES):
                raise OutcomeUnknown(f"the server could not take an append now: {ack.error}")
            if code != TOO_MANY_INFLIGHT:
                raise PersistenceError(f"append refused: {ack.error}")
            await asyncio.sleep(INFLIGHT_PAUSE_SECONDS)  # back-off the server asked for
        raise OutcomeUnknown("the server kept refusing the batch as one too many in flight")

    async def _send(self, messages: Sequence[Outgoing]) -> PubAck:
        nc = self.nc
        last = len(messages)
        batch = uuid.uuid4().hex if last > 1 else ""
        try:
            for n, out in enumerate(messages, 1):
                headers = dict(out.headers)
                if out.expect is not None:
                    headers[EXPECTED_SEQUENCE_HEADER] = str(out.expect)
                    if out.expect_subject:
                        headers[EXPECTED_SUBJECT_HEADER] = out.expect_subject
                if last == 1:
                    reply = await request(nc, out.subject, out.data, headers=headers,
                                          timeout=ACK_TIMEOUT)
                    return decode_pub_ack(reply.data)
                headers["Nats-Batch-Id"] = batch
                headers["Nats-Batch-Sequence"] = str(n)
                if n < last:
                    await nc.publish(out.subject, out.data, headers=headers)
                    continue
                headers["Nats-Batch-Commit"] = "1"
                reply = await request(nc, out.subject, out.data, headers=headers,
                                      timeout=ACK_TIMEOUT)
                return decode_pub_ack(reply.data)
        except MaxPayloadError as e:  # refused before anything of the batch was committed
            raise PersistenceError(f"a message is larger than the server takes ({e})") from e
        except (TimeoutError, NatsError) as e:
            raise OutcomeUnknown(f"no answer to an append: {e!r}") from e
        raise ProgrammingError("an append needs at least one message")


class JetStreamDatastore(EventLog):
    """The event log behind the `eventsourcing` recorders: its own connection, on a
    bridge thread, with the library's append semantics (versions, hinted expectations)."""

    def __init__(self, url: str, layout: Layout) -> None:
        self.bridge = NatsBridge(url, name=f"{layout.prefix}-store")
        super().__init__(self.bridge.nc, layout)
        self._ensured: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, space: StreamSpace) -> None:
        """Create `space`'s stream if it is missing, once per process; never reconfigure it."""
        with self._lock:
            if space.stream in self._ensured:
                return
            config = (events_stream_config(self.layout) if space == self.events
                      else snapshots_stream_config(self.layout))
            self.bridge.run(create_stream_if_missing(self.js, config))
            self._ensured.add(space.stream)

    def close(self) -> None:
        self.bridge.close()

    # -- the library's append ----------------------------------------------------------

    async def append(
        self,
        space: StreamSpace,
        stored_events: Sequence[StoredEvent],
        tracking: Tracking | None = None,
    ) -> list[int]:
        """Append atomically; the stream sequences of `stored_events`, in their order."""
        groups = _group_by_subject(space.root, stored_events)
        tracking_subject = (
            self.layout.tracking_subject(tracking.application_name) if tracking else None
        )
        if len(stored_events) + (tracking is not None) > MAX_BATCH:
            raise ProgrammingError(f"an atomic append holds at most {MAX_BATCH} events")
        stale: set[str] = set()
        for _attempt in range(MAX_APPEND_ATTEMPTS):
            for subject in stale:
                await self.refresh(space.stream, subject)
            expected: dict[str, int] = {}
            for subject, events in groups.items():
                last = self._last.get(subject)
                if last is not None and events[0].originator_version <= last[0]:
                    raise IntegrityError(
                        f"{events[0].originator_id} already has version {last[0]}"
                    )
                expected[subject] = last[1] if last else 0
            messages: list[Outgoing] = []
            for s in stored_events:
                subject = aggregate_subject(space.root, s.originator_id)
                messages.append(Outgoing(subject, s.state, _event_headers(s),
                                         expected.pop(subject, None)))
            if tracking is not None and tracking_subject is not None:
                last = self._last.get(tracking_subject)
                if last is not None and tracking.notification_id <= last[0]:
                    raise IntegrityError(
                        f"tracking {tracking.application_name} is at {last[0]}, "
                        f"not below {tracking.notification_id}"
                    )
                messages.append(Outgoing(tracking_subject, b"", _tracking_headers(tracking),
                                         last[1] if last else 0))
            try:
                seqs = await self.publish(messages)
            except AppendConflict as e:
                if not e.stale_sequence:
                    raise IntegrityError(
                        "an event with this aggregate version was already recorded") from e
                stale = {m.subject for m in messages if m.expect is not None}
                continue
            for message, seq in zip(messages, seqs, strict=True):
                self.remember(message.subject, int(message.headers[VERSION_HEADER]), seq)
            return seqs[: len(stored_events)]
        raise IntegrityError("append kept racing concurrent writers; retry from fresh state")


def _group_by_subject(
    root: str, stored_events: Sequence[StoredEvent]
) -> dict[str, list[StoredEvent]]:
    groups: dict[str, list[StoredEvent]] = {}
    for s in stored_events:
        events = groups.setdefault(aggregate_subject(root, s.originator_id), [])
        if events and s.originator_version <= events[-1].originator_version:
            raise IntegrityError(
                f"versions of {s.originator_id} must increase within one append"
            )
        events.append(s)
    return groups


def event_headers(msg_id: str, topic: str, version: int) -> dict[str, str]:
    """The headers every stored event carries: its id (which dedupes a retried publish),
    its stable topic and its aggregate version."""
    return {"Nats-Msg-Id": msg_id, TOPIC_HEADER: topic, VERSION_HEADER: str(version)}


def _event_headers(s: StoredEvent) -> dict[str, str]:
    return event_headers(event_id(s.originator_id, s.originator_version), s.topic,
                         s.originator_version)


def tracking_id(application_name: str, notification_id: int) -> str:
    """The message id of a tracking record: one per application and position."""
    return f"trk:{application_name}:{notification_id}"


def _tracking_headers(t: Tracking) -> dict[str, str]:
    return {
        "Nats-Msg-Id": tracking_id(t.application_name, t.notification_id),
        VERSION_HEADER: str(t.notification_id),
    }


