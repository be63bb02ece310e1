"""The event envelope and its codec: msgspec Structs, msgpack on the wire, JSON for people.

A stored event's topic is `<TypeName>.v<schema>`: a stable name chosen by us, never a
Python path, so modules can move without breaking the log. When a type's schema moves on,
it declares an upcaster per old version; old records are upcast on read, the log is never
rewritten.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar
from uuid import UUID

import msgspec
from eventsourcing.persistence import Mapper, MapperDeserialisationError, StoredEvent

from events.language.ids import name_uuid

EVENT_ID_NAMESPACE = UUID("6f1c3f4e-8d0b-5c7a-9b39-7a1e0c6d2b11")

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


@functools.lru_cache(maxsize=8192)
def event_id(originator_id: UUID | str, originator_version: int) -> str:
    """An event's id, derived from its aggregate position so a retried append dedupes;
    remembered for the newest events, which the writer, the follower and the dispatcher
    each ask for."""
    return name_uuid(EVENT_ID_NAMESPACE, f"{originator_id}:{originator_version}")


def now() -> datetime:
    return datetime.now(UTC)


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every domain event: who did what to which aggregate, and why.

    `causation_id` is the command that caused the event; `correlation_id` ties together
    everything that followed from one user request.
    """

    TYPE: ClassVar[str] = ""
    SCHEMA: ClassVar[int] = 1
    UPCASTERS: ClassVar[dict[int, Upcaster]] = {}

    originator_id: str
    originator_version: int
    timestamp: datetime
    actor: str
    correlation_id: str
    causation_id: str
    marker_follows: bool = False
    """Stored alone, before its command's outcome marker (the writer's plain-publish path):
    until that marker is in the log, the command is settled by this event (see
    `controlplane.writeprotocol`). False for every event of an atomic batch, and for old events."""

    @property
    def id(self) -> str:
        return event_id(self.originator_id, self.originator_version)

    @classmethod
    def topic(cls) -> str:
        return f"{cls.TYPE}.v{cls.SCHEMA}"


_REGISTRY: dict[str, type[Event]] = {}
E = TypeVar("E", bound=type[Event])


def event_type(name: str) -> Callable[[E], E]:
    """Register an event class under its stable type name."""

    def register(cls: E) -> E:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"event type name {name!r} is already taken")
        cls.TYPE = name
        _REGISTRY[name] = cls
        return cls

    return register


def event_class(name: str) -> type[Event]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise MapperDeserialisationError(f"unknown event type {name!r}") from None


def split_topic(topic: str) -> tuple[str, int]:
    name, _, schema = topic.rpartition(".v")
    return name, int(schema)


_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type[Event], msgspec.msgpack.Decoder[Any]] = {}
_building = threading.Lock()


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


KEPT_WRITES = 4096
"""Events written by this process whose bytes are kept for `decode` (`encode_kept`)."""
_kept: dict[tuple[str, bytes], Event] = {}
_keeping = threading.Lock()


def encode_kept(event: Event) -> bytes:
    """`encode`, and the event kept for the first `decode` of these bytes: a process's own
    writes come back from the log (its follower) as they went, not decoded again. The same
    bytes decode to an equal event, and views never change what an event holds in place
    (`View.copy`), so sharing it is safe. Kept writes that never come back (refused ones) are
    forgotten, oldest first."""
    data = _encoder.encode(event)
    with _keeping:
        _kept[(event.topic(), data)] = event
        while len(_kept) > KEPT_WRITES:
            del _kept[next(iter(_kept))]
    return data


def _build_decoder(cls: type[Event]) -> msgspec.msgpack.Decoder[Any]:
    """The class's decoder, built by one thread at a time: a process using the library's
    store (its bridge thread) and asyncio readers may first decode a class at once, and
    msgspec building the same class's type information in two threads crashed the control
    plane (SIGSEGV) when it had a writer thread."""
    with _building:
        decoder = _decoders.get(cls)
        if decoder is None:
            decoder = _decoders[cls] = msgspec.msgpack.Decoder(cls)
        return decoder


def decode(topic: str, state: bytes) -> Event:
    """Decode a stored event, upcasting an old schema on the way."""
    kept = _kept.pop((topic, state), None)  # one call: atomic against `encode_kept`
    if kept is not None:
        return kept
    name, schema = split_topic(topic)
    cls = event_class(name)
    if schema > cls.SCHEMA:
        raise MapperDeserialisationError(
            f"{topic} is newer than this version reads (schema {cls.SCHEMA})")
    if schema == cls.SCHEMA:
        decoder = _decoders.get(cls) or _build_decoder(cls)
        return decoder.decode(state)  # type: ignore[no-any-return]
    data: dict[str, Any] = msgspec.msgpack.decode(state)
    for version in range(schema, cls.SCHEMA):
        data = cls.UPCASTERS[version](data)
    return msgspec.convert(data, cls)


class EventMapper(Mapper[str]):
    """Maps msgspec events to the library's StoredEvent; used by every virtbus Application."""

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        event: Event = domain_event
        state = encode(event)
        if self.compressor:
            state = self.compressor.compress(state)
        if self.cipher:
            state = self.cipher.encrypt(state)
        return StoredEvent(
            originator_id=event.originator_id,
            originator_version=event.originator_version,
            topic=event.topic(),
            state=state,
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        state = stored_event.state
        try:
            if self.cipher:
                state = self.cipher.decrypt(state)
            if self.compressor:
                state = self.compressor.decompress(state)
            return decode(stored_event.topic, state)
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError, ValueError) as e:
            raise MapperDeserialisationError(
                f"cannot decode {stored_event.topic} of {stored_event.originator_id} "
                f"v{stored_event.originator_version}: {e}"
            ) from e
