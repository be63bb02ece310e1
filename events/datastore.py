"""The JetStream side of the event store: one connection, what appends have learned, and the
atomic append itself. `events.jetstream` wraps it in the `eventsourcing` recorder classes.

An append groups events by aggregate subject, expects each subject's last sequence (from a
cached hint, refreshed when the server says it is stale), and publishes one atomic batch.
A version that already exists, in the store or twice in one append, is `IntegrityError`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Final

import msgspec
from eventsourcing.persistence import (
    IntegrityError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
    Tracking,
)
from nats.aio.msg import Msg

from events.bridge import NatsBridge
from events.codec import event_id
from events.directget import direct_batch, last_on, read_all, sequence
from events.streams import (
    create_stream_if_missing,
    events_stream_config,
    snapshots_stream_config,
)
from events.subjects import Layout, aggregate_subject

MAX_BATCH: Final = 1000
"""JetStream's limit on messages in one atomic batch."""
MAX_APPEND_ATTEMPTS: Final = 5

ACK_TIMEOUT: Final = 10.0
"""How long an append waits for JetStream's ack before it counts as failed."""
TOPIC_HEADER: Final = "Vb-Topic"
VERSION_HEADER: Final = "Vb-Version"
_WRONG_LAST_SEQUENCE: Final = 10071
_BATCH_DUPLICATE_ID: Final = 10201


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    count: int = 1
    error: _ApiError | None = None


_decode_ack = msgspec.json.Decoder(_PubAck).decode


class StreamSpace(msgspec.Struct, frozen=True):
    """Where one recorder keeps aggregates: a stream and the subject root inside it."""

    stream: str
    root: str


class JetStreamDatastore:
    """One NATS connection (through the bridge), the layout, and what appends have learned.

    `_last` remembers, per subject, the newest (version, sequence) this process has seen, so
    an append after a read needs no extra round trip. It is only a hint: the server checks
    the expected sequence, and a stale hint costs one refresh, never a wrong write.
    """

    def __init__(self, url: str, layout: Layout) -> None:
        self.layout = layout
        self.bridge = NatsBridge(url, name=f"{layout.prefix}-store")
        self.js = self.bridge.nc.jetstream()
        self._last: dict[str, tuple[int, int]] = {}
        self._ensured: set[str] = set()
        self._lock = threading.Lock()
        self.events = StreamSpace(layout.events_stream, layout.events_root)
        self.snapshots = StreamSpace(layout.snapshots_stream, layout.snapshots_root)

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

    # -- reads -------------------------------------------------------------------------

    async def direct_batch(self, stream: str, start: int, limit: int, subject: str) -> list[Msg]:
        return await direct_batch(self.bridge.nc, stream, start, limit, subject)

    async def read_all(self, stream: str, subject: str) -> list[Msg]:
        return await read_all(self.bridge.nc, stream, subject)

    async def last_on(self, stream: str, subject: str) -> Msg | None:
        return await last_on(self.bridge.nc, stream, subject)

    async def subjects(self, stream: str, subject_filter: str) -> list[str]:
        """The subjects holding messages under `subject_filter`, from the stream's state."""
        info = await self.js.stream_info(stream, subjects_filter=subject_filter)
        return sorted(info.state.subjects or {})

    def remember(self, subject: str, version: int, seq: int) -> None:
        last = self._last.get(subject)
        if last is None or last[1] < seq:
            self._last[subject] = (version, seq)

    async def refresh(self, stream: str, subject: str) -> tuple[int, int] | None:
        msg = await self.last_on(stream, subject)
        if msg is None:
            self._last.pop(subject, None)
            return None
        headers = msg.headers or {}
        last = (int(headers[VERSION_HEADER]), sequence(msg))
        self._last[subject] = last
        return last

    # -- appends -----------------------------------------------------------------------

    async def append(
        self,
        space: StreamSpace,
        stored_events: Sequence[StoredEvent],
        tracking: Tracking | None = None,
    ) -> list[int]:
        """Append atomically; return the stream sequences of `stored_events`."""
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
            messages = [
                (subject, s.state, _event_headers(s)) for subject, evs in groups.items()
                for s in evs
            ]
            if tracking is not None and tracking_subject is not None:
                last = self._last.get(tracking_subject)
                if last is not None and tracking.notification_id <= last[0]:
                    raise IntegrityError(
                        f"tracking {tracking.application_name} is at {last[0]}, "
                        f"not below {tracking.notification_id}"
                    )
                expected[tracking_subject] = last[1] if last else 0
                messages.append((tracking_subject, b"", _tracking_headers(tracking)))
            ack = await self._publish(messages, expected)
            if ack.error is None and not ack.duplicate:
                first = ack.seq - ack.count + 1
                seqs = list(range(first, first + len(messages)))
                for (subject, _state, headers), seq in zip(messages, seqs, strict=True):
                    self.remember(subject, int(headers[VERSION_HEADER]), seq)
                return seqs[: len(stored_events)]
            if ack.duplicate or (ack.error and ack.error.err_code == _BATCH_DUPLICATE_ID):
                raise IntegrityError("an event with this aggregate version was already recorded")
            if ack.error and ack.error.err_code == _WRONG_LAST_SEQUENCE:
                stale = set(expected)
                continue
            raise PersistenceError(f"append refused: {ack.error}")
        raise IntegrityError("append kept racing concurrent writers; retry from fresh state")

    async def _publish(
        self, messages: list[tuple[str, bytes, dict[str, str]]], expected: dict[str, int]
    ) -> _PubAck:
        nc = self.bridge.nc
        seen: set[str] = set()
        for subject, _state, headers in messages:
            if subject not in seen:
                seen.add(subject)
                headers["Nats-Expected-Last-Subject-Sequence"] = str(expected[subject])
        if len(messages) == 1:
            subject, state, headers = messages[0]
            reply = await nc.request(subject, state, headers=headers, timeout=ACK_TIMEOUT)
            return _decode_ack(reply.data)
        batch = uuid.uuid4().hex
        last = len(messages)
        for n, (subject, state, headers) in enumerate(messages, 1):
            headers["Nats-Batch-Id"] = batch
            headers["Nats-Batch-Sequence"] = str(n)
            if n < last:
                await nc.publish(subject, state, headers=headers)
        subject, state, headers = messages[-1]
        headers["Nats-Batch-Commit"] = "1"
        reply = await nc.request(subject, state, headers=headers, timeout=ACK_TIMEOUT)
        return _decode_ack(reply.data)


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


def _event_headers(s: StoredEvent) -> dict[str, str]:
    return {
        "Nats-Msg-Id": str(event_id(s.originator_id, s.originator_version)),
        TOPIC_HEADER: s.topic,
        VERSION_HEADER: str(s.originator_version),
    }


def _tracking_headers(t: Tracking) -> dict[str, str]:
    return {
        "Nats-Msg-Id": f"trk:{t.application_name}:{t.notification_id}",
        VERSION_HEADER: str(t.notification_id),
    }


