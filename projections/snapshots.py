"""Snapshots of the read model (`ClusterState`), so a reader starts from a recent one and
folds only the tail of the log: a restart, a point-in-time read or a resumed watch costs
what is new, not the whole history.

Snapshots are derived data, kept in the object store `<P>_READ_SNAPSHOTS` (a ring: the
oldest go when it is full), one object per snapshot, named `<schema>.<sequence>`. The read
service writes one every `SNAPSHOT_EVERY_EVENTS` events; the control plane, the read service,
`get --at` and `watch --since` start from the newest one at or before where they must
start. Deleting every snapshot changes no answer, only the time it takes.

A snapshot is only as good as the code that folded it, so each carries `SNAPSHOT_SCHEMA`, a
digest of the code that reads the log (`events` and `projections`): one written by another
version is ignored, as is one that does not decode (bytes are hostile until proven not). Each
ignored one is logged with its name and reason and counted (`Snapshots.ignored`); the reader
falls back to an older snapshot or to the log from its start.

The views are plain objects, so each is written as its attributes through `_pack`, which
keeps every Python type the views hold (tuples, sets, datetimes, msgspec Structs) as a
tagged msgpack extension, and refuses any other: a state it cannot write exactly is not
written. Reading back builds only what the tags name: view classes of `VIEW_KINDS` and
Structs of `events` and `projections`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.object_store import ObjectStore

from events.aio import pause_unless_stopped
from events.subjects import Layout
from events.transient import describe
from projections.cluster import VIEW_KINDS, ClusterState
from projections.views import View

log = structlog.get_logger(__name__)

SNAPSHOT_EVERY_EVENTS: Final = 2000
"""Events folded between two snapshots the read service writes."""
SNAPSHOT_CHECK_SECONDS: Final = 5.0
"""How often the read service looks whether a snapshot is due."""
SNAPSHOT_READ_SECONDS: Final = 10.0
"""How long reading one snapshot may take before it is given up (an object whose chunks the
ring dropped would otherwise be waited for)."""
SNAPSHOT_CANDIDATES: Final = 3
"""Snapshots a reader tries, newest first, before it folds the log from its start."""

_READ_SIDE: Final = ("events", "projections")


def _code_digest() -> str:
    """A digest of the code that folds the log: what a snapshot's meaning depends on."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in _READ_SIDE:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


SNAPSHOT_SCHEMA: Final = _code_digest()

# Ignored snapshots, by reason.
FOREIGN: Final = "foreign_schema"
CORRUPT: Final = "corrupt"
UNREADABLE: Final = "unreadable"


class SnapshotRejected(Exception):
    """Bytes that are not a snapshot this version can trust."""


class Unsnapshottable(Exception):
    """A state holding a value `_pack` cannot write back exactly."""


class _ViewRecord(msgspec.Struct, array_like=True, frozen=True):
    kind: str
    id: str
    attributes: msgspec.msgpack.Ext


class _SnapshotFile(msgspec.Struct, frozen=True, kw_only=True):
    schema: str
    sequence: int
    skipped: dict[str, int]
    views: list[_ViewRecord]


# msgpack extension codes of `_pack`.
_TUPLE, _SET, _FROZENSET, _DICT, _DATETIME, _TIMEDELTA, _STRUCT = range(1, 8)
_SCALARS: Final = (bool, int, float, str, bytes)


def _struct_types() -> dict[str, type[msgspec.Struct]]:
    """Every Struct of the read side, by `module:qualname`: all a snapshot may name."""
    found: dict[str, type[msgspec.Struct]] = {}
    pending: list[type[msgspec.Struct]] = [msgspec.Struct]
    while pending:
        for cls in pending.pop().__subclasses__():
            pending.append(cls)
            if cls.__module__.split(".", 1)[0] in _READ_SIDE:
                found[f"{cls.__module__}:{cls.__qualname__}"] = cls
    return found


_STRUCTS: dict[str, type[msgspec.Struct]] = {}


def _structs() -> dict[str, type[msgspec.Struct]]:
    if not _STRUCTS:
        _STRUCTS.update(_struct_types())
    return _STRUCTS


def _pack(value: Any) -> Any:
    """`value` as msgspec encodes it, every type the views hold kept by a tag."""
    kind = type(value)
    if value is None or kind in _SCALARS:
        return value
    if kind is list:
        return [_pack(v) for v in value]
    if kind is tuple:
        return _ext(_TUPLE, [_pack(v) for v in value])
    if kind is dict:
        return _ext(_DICT, [[_pack(k), _pack(v)] for k, v in value.items()])
    if kind is set or kind is frozenset:
        return _ext(_SET if kind is set else _FROZENSET, [_pack(v) for v in value])
    if kind is datetime:
        return msgspec.msgpack.Ext(_DATETIME, value.isoformat().encode())
    if kind is timedelta:
        return _ext(_TIMEDELTA, [value.days, value.seconds, value.microseconds])
    if isinstance(value, msgspec.Struct):
        name = f"{kind.__module__}:{kind.__qualname__}"
        if _structs().get(name) is kind:
            return _ext(_STRUCT, [name, msgspec.msgpack.encode(value)])
    raise Unsnapshottable(f"{kind.__module__}.{kind.__qualname__}")


def _ext(code: int, items: Any) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(code, msgspec.msgpack.encode(items))


def _struct_of(items: list[Any]) -> msgspec.Struct:
    name, body = items
    cls = _structs().get(name)
    if cls is None:
        raise SnapshotRejected(f"names no Struct of this version: {name!r}")
    return msgspec.msgpack.decode(body, type=cls)


_BUILDERS: Final[dict[int, Any]] = {
    _TUPLE: tuple,
    _SET: set,
    _FROZENSET: frozenset,
    _DICT: lambda items: {k: v for k, v in items},
    _TIMEDELTA: lambda items: timedelta(days=items[0], seconds=items[1],
                                        microseconds=items[2]),
    _STRUCT: _struct_of,
}


def _unpack_ext(code: int, data: memoryview) -> Any:
    """The value a `_pack` tag stands for; any other tag is refused."""
    if code == _DATETIME:
        return datetime.fromisoformat(bytes(data).decode())
    build = _BUILDERS.get(code)
    if build is None:
        raise SnapshotRejected(f"unknown extension {code}")
    return build(_DECODER.decode(data))


_DECODER: Final = msgspec.msgpack.Decoder(ext_hook=_unpack_ext)


def encode_state(state: ClusterState) -> bytes:
    """`state` as a snapshot at its `last_sequence`; `Unsnapshottable` if it holds a value
    that could not be read back exactly."""
    kinds = {cls: kind for kind, cls in VIEW_KINDS.items()}
    records = [_ViewRecord(kinds[type(view)], agg_id, _pack(dict(vars(view))))
               for agg_id, view in state.views.items()]
    return msgspec.msgpack.encode(_SnapshotFile(
        schema=SNAPSHOT_SCHEMA, sequence=state.last_sequence, skipped=dict(state.skipped),
        views=records))


def decode_state(data: bytes) -> ClusterState:
    """The state a snapshot holds; `SnapshotRejected` for anything else, a snapshot of
    another code version included."""
    try:
        snapshot = msgspec.msgpack.decode(data, type=_SnapshotFile)
    except msgspec.DecodeError as e:
        raise SnapshotRejected(f"not a snapshot: {e}") from e
    if snapshot.schema != SNAPSHOT_SCHEMA:
        raise SnapshotRejected(f"schema {snapshot.schema!r}, this version's is "
                               f"{SNAPSHOT_SCHEMA!r}")
    state = ClusterState()
    state.last_sequence = snapshot.sequence
    state.skipped = Counter(snapshot.skipped)
    for record in snapshot.views:
        state.views[record.id] = _view(record)
    return state


def _view(record: _ViewRecord) -> View:
    cls = VIEW_KINDS.get(record.kind)
    if cls is None or record.attributes.code != _DICT:
        raise SnapshotRejected(f"not a view: {record.kind!r} {record.id!r}")
    try:
        attributes = _unpack_ext(record.attributes.code, memoryview(record.attributes.data))
    except (msgspec.DecodeError, ValueError, TypeError, IndexError, RecursionError) as e:
        raise SnapshotRejected(f"view {record.id!r}: {type(e).__name__}: {e}") from e
    fresh = vars(cls(record.id))
    if attributes.keys() != fresh.keys() or attributes["id"] != record.id or any(
            fresh[k] is not None and type(v) is not type(fresh[k])
            for k, v in attributes.items()):
        raise SnapshotRejected(f"view {record.id!r} is not a {cls.__name__} as this "
                               "version makes one")
    view = cls.__new__(cls)
    vars(view).update(attributes)
    return view


def object_name(sequence: int) -> str:
    return f"{SNAPSHOT_SCHEMA}.{sequence:012d}"


def _sequence_of(name: str) -> int | None:
    """The sequence an object of this version's name is at; None for any other name."""
    schema, _, sequence = name.partition(".")
    return int(sequence) if schema == SNAPSHOT_SCHEMA and sequence.isdigit() else None


class Snapshots:
    """The installation's snapshots: written by the read service, read by every reader."""

    def __init__(self, nc: Client, layout: Layout) -> None:
        self.nc = nc
        self.layout = layout
        self.ignored: Counter[str] = Counter()
        """Snapshots passed over, by reason (`FOREIGN`, `CORRUPT`, `UNREADABLE`)."""
        self._store: ObjectStore | None = None

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            self._store = await self.nc.jetstream().object_store(
                self.layout.read_snapshots_bucket)
        return self._store

    async def save(self, state: ClusterState) -> bool:
        """Write `state` as a snapshot; False (with a warning) if it could not be: a
        snapshot is for speed, so nothing fails for the want of one."""
        started = time.monotonic()
        try:
            data = encode_state(state)
            await (await self._bucket()).put(object_name(state.last_sequence), data)
        except (Unsnapshottable, TimeoutError, NatsError) as e:
            log.warning("snapshot not written", sequence=state.last_sequence,
                        error=describe(e) if not isinstance(e, Unsnapshottable) else str(e))
            return False
        log.info("snapshot written", sequence=state.last_sequence, views=len(state.views),
                 bytes=len(data), seconds=round(time.monotonic() - started, 3))
        return True

    async def latest(self, at_most: int | None = None) -> ClusterState | None:
        """The newest snapshot this version can trust at or before sequence `at_most`
        (any, when None); None when there is none (the log is folded from its start)."""
        try:
            store = await self._bucket()
            infos = await store.list(ignore_deletes=True)
        except (TimeoutError, NatsError) as e:  # none yet (NotFound), or not reachable
            log.debug("no snapshots", error=describe(e))
            return None
        candidates: list[tuple[int, str]] = []
        for info in infos:
            name = info.name or ""
            sequence = _sequence_of(name)
            if sequence is None:
                self._ignore(name, FOREIGN, "another code version's, or no snapshot's name")
            elif at_most is None or sequence <= at_most:
                candidates.append((sequence, name))
        for sequence, name in sorted(candidates, reverse=True)[:SNAPSHOT_CANDIDATES]:
            state = await self._read(store, name)
            if state is None:
                continue
            if state.last_sequence != sequence:
                self._ignore(name, CORRUPT, f"holds sequence {state.last_sequence}")
                continue
            return state
        return None

    async def _read(self, store: ObjectStore, name: str) -> ClusterState | None:
        try:
            got = await asyncio.wait_for(store.get(name), SNAPSHOT_READ_SECONDS)
        except (TimeoutError, NatsError) as e:
            self._ignore(name, UNREADABLE, describe(e))
            return None
        try:
            return decode_state(got.data or b"")
        except SnapshotRejected as e:
            reason = FOREIGN if str(e).startswith("schema") else CORRUPT
            self._ignore(name, reason, str(e))
            return None

    def _ignore(self, name: str, reason: str, detail: str) -> None:
        self.ignored[reason] += 1
        log.warning("snapshot ignored", name=name, reason=reason, detail=detail,
                    ignored=self.ignored[reason])


async def restore(snapshots: Snapshots, state: ClusterState, at_most: int | None = None, *,
                  announce: bool = True) -> int:
    """Make `state` (an empty one, which others may hold already) the newest usable
    snapshot at or before `at_most`; the first sequence left to fold. A process's start
    `announce`s it (an info line); a point-in-time read, done per query, logs it at debug."""
    found = await snapshots.latest(at_most)
    if found is None:
        return 1
    state.views, state.last_sequence, state.skipped = (found.views, found.last_sequence,
                                                      found.skipped)
    (log.info if announce else log.debug)(
        "read model restored from a snapshot", sequence=found.last_sequence,
        views=len(found.views))
    return found.last_sequence + 1


async def keep_writing(snapshots: Snapshots, state: ClusterState, stop: asyncio.Event,
                       every: int = SNAPSHOT_EVERY_EVENTS) -> None:
    """Write a snapshot of `state` (folded by someone else, in the same loop, so it stands
    at a whole event between two awaits) each time it has moved `every` events on."""
    saved = state.last_sequence
    while not stop.is_set():
        await pause_unless_stopped(stop, SNAPSHOT_CHECK_SECONDS)
        if state.last_sequence - saved >= every:
            saved = state.last_sequence  # a failed write, too, is tried again `every` on
            await snapshots.save(state)
