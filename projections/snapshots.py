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

The views are plain objects, so each is written as a row of its attribute values, in one
section per view class (its attribute names once), through `_Packer`, which keeps every
Python type the views hold (tuples, sets, datetimes, msgspec Structs) as msgpack's own or a
tagged extension, and refuses any other: a state it cannot write exactly is not written.
Each distinct Struct value is written once, in one array per Struct class decoded in one
call. The whole is zlib-compressed. Reading back builds only what the tags name: view
classes of `FOLDS` as this version makes them and Structs of `events` and
`projections`; a point-in-time read decodes only the sections of the kinds it renders. A
snapshot's chunks are read by batched Direct Get; one the ring has cut short is passed over
at once.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
import time
import zlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.api import ObjectInfo
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from events.jetstream.directget import read_all
from events.jetstream.transient import describe, retry_within
from events.language.subjects import Layout
from events.runtime.aio import pause_unless_stopped
from projections.bulk import uncollected
from projections.cluster import ClusterState
from projections.kinds import FOLDS, fold_of
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
SNAPSHOT_LIST_SECONDS: Final = 15.0
"""How long a reader keeps asking for the list of snapshots while NATS does not answer (a
busy server, a leader being elected) before it folds the log from its start instead: a few
of a request's own timeouts, and shorter than folding 10,000 VMs' log from its start."""

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


class _StructSection(msgspec.Struct, array_like=True, frozen=True):
    """The distinct values of one Struct class, by `module:qualname`: one msgpack array,
    decoded in one call."""

    name: str
    values: msgspec.Raw


class _RowSection(msgspec.Struct, array_like=True, frozen=True):
    """The views of one class (`FOLDS`' token), each a row of its attribute values in
    `keys`' order, as `_Packer` writes them: a reader decodes only the kinds it asks for."""

    kind: str
    keys: list[str]
    rows: msgspec.Raw


class _Content(msgspec.Struct, frozen=True, kw_only=True):
    skipped: dict[str, int]
    structs: list[_StructSection]
    views: list[_RowSection]
    order: list[int]
    """Each view's section, in the state's order: a state read back iterates its views as
    the one written did (what a restarted control plane reconciles first), and writes the
    same bytes again."""


class _SnapshotFile(msgspec.Struct, frozen=True, kw_only=True):
    schema: str
    sequence: int
    content: bytes
    """`_Content`, zlib-compressed: views repeat themselves a lot (a fleet's VMs are alike), so
    it is a tenth the size, which the ring keeps ten times as many of."""


# msgpack extension codes of `_Packer`.
_TUPLE, _SET, _FROZENSET, _DICT, _DATETIME, _TIMEDELTA, _STRUCT = range(1, 8)
_SCALARS: Final = (bool, int, float, str, bytes)
_REFERENCE: Final = struct.Struct(">HI")
"""A Struct tag's payload: its class's section, and its place there."""
MAX_SNAPSHOT_BYTES: Final = 1 << 30
"""The most a snapshot may inflate to: a compressed bomb is refused, not inflated."""
_COMPRESSION_LEVEL: Final = 1
"""zlib's fastest: the tenfold saving is in the first level already."""


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


class _Packer:
    """Writes values as msgspec encodes them, every type the views hold kept by a tag. Each
    distinct Struct value goes once into its class's section and is named by the section
    and its place there: views share most of theirs (a VM's spec and its VMI's, a fleet's
    identical specs), so a reader decodes each once and the views share it again, as
    `View.copy` shares them live."""

    def __init__(self) -> None:
        self._sections: dict[str, tuple[int, list[bytes]]] = {}
        self._by_body: dict[tuple[str, bytes], bytes] = {}
        self._by_identity: dict[int, tuple[bytes, msgspec.Struct]] = {}

    def structs(self) -> list[_StructSection]:
        return [_StructSection(name, msgspec.Raw(msgspec.msgpack.encode(
            [msgspec.Raw(body) for body in bodies]))) for name, (_, bodies) in
                self._sections.items()]

    def pack(self, value: Any) -> Any:
        kind = type(value)
        if value is None or kind in _SCALARS:
            return value
        if kind is list:
            return [self.pack(v) for v in value]
        if kind is datetime and value.tzinfo is UTC:
            return value  # msgpack's own timestamp, read back as this very datetime
        if kind is tuple:
            return self._ext(_TUPLE, [self.pack(v) for v in value])
        if kind is dict:
            return self._ext(_DICT, [[self.pack(k), self.pack(v)] for k, v in value.items()])
        if kind is set or kind is frozenset:
            return self._ext(_SET if kind is set else _FROZENSET, [self.pack(v) for v in value])
        if kind is datetime:
            return msgspec.msgpack.Ext(_DATETIME, value.isoformat().encode())
        if kind is timedelta:
            return self._ext(_TIMEDELTA, [value.days, value.seconds, value.microseconds])
        if isinstance(value, msgspec.Struct):
            name = f"{kind.__module__}:{kind.__qualname__}"
            if _structs().get(name) is kind:
                return msgspec.msgpack.Ext(_STRUCT, self._reference(name, value))
        raise Unsnapshottable(f"{kind.__module__}.{kind.__qualname__}")

    def _reference(self, name: str, value: msgspec.Struct) -> bytes:
        """The value's section and place in it, as `_REFERENCE` packs them."""
        known = self._by_identity.get(id(value))
        if known is not None and known[1] is value:
            return known[0]
        body = msgspec.msgpack.encode(value)
        reference = self._by_body.get((name, body))
        if reference is None:
            section, bodies = self._sections.setdefault(name, (len(self._sections), []))
            reference = _REFERENCE.pack(section, len(bodies))
            bodies.append(body)
            self._by_body[(name, body)] = reference
        self._by_identity[id(value)] = (reference, value)  # held, so its id is not reused
        return reference

    @staticmethod
    def _ext(code: int, items: Any) -> msgspec.msgpack.Ext:
        return msgspec.msgpack.Ext(code, msgspec.msgpack.encode(items))


def _section_of(section: _StructSection) -> list[msgspec.Struct]:
    cls = _structs().get(section.name)
    if cls is None:
        raise SnapshotRejected(f"names no Struct of this version: {section.name!r}")
    return msgspec.msgpack.decode(section.values, type=list[cls])  # type: ignore[valid-type]


_BUILDERS: Final[dict[int, Any]] = {
    _TUPLE: tuple,
    _SET: set,
    _FROZENSET: frozenset,
    _DICT: lambda items: {k: v for k, v in items},
    _TIMEDELTA: lambda items: timedelta(days=items[0], seconds=items[1],
                                        microseconds=items[2]),
}


def _decoder(sections: list[_StructSection],
             decoded: list[list[msgspec.Struct] | None]) -> msgspec.msgpack.Decoder[Any]:
    """A decoder of `_Packer`'s values, its Struct tags naming values of `sections` (each
    section decoded when first named, kept in `decoded`); any other tag is refused. Its hook
    refers to it (nested values), a cycle only the collector frees: clear `decoded` when
    done, so the values go with the state that holds them, not at the next collection."""

    def unpack_ext(code: int, data: memoryview) -> Any:
        if code == _STRUCT:
            section, place = _REFERENCE.unpack(data)
            values = decoded[section]
            if values is None:
                values = decoded[section] = _section_of(sections[section])
            return values[place]
        if code == _DATETIME:
            return datetime.fromisoformat(bytes(data).decode())
        build = _BUILDERS.get(code)
        if build is None:
            raise SnapshotRejected(f"unknown extension {code}")
        return build(decoder.decode(data))

    decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(ext_hook=unpack_ext)
    return decoder


def encode_state(state: ClusterState) -> bytes:
    """`state` as a snapshot at its `last_sequence`; `Unsnapshottable` if it holds a value
    that could not be read back exactly."""
    kinds = {cls: kind for kind, cls in FOLDS.items()}
    sections: dict[tuple[type[View], tuple[str, ...]], list[View]] = {}
    index: dict[tuple[type[View], tuple[str, ...]], int] = {}
    order = []
    for view in state.views.values():
        shape = (type(view), tuple(vars(view)))
        order.append(index.setdefault(shape, len(index)))
        sections.setdefault(shape, []).append(view)
    packer = _Packer()  # section by section: a state read back packs in the same order
    views = [_RowSection(kinds[cls], list(keys), msgspec.Raw(msgspec.msgpack.encode(
        [[packer.pack(v) for v in vars(view).values()] for view in section])))
        for (cls, keys), section in sections.items()]
    content = _Content(skipped=dict(state.skipped), structs=packer.structs(), views=views,
                       order=order)
    return msgspec.msgpack.encode(_SnapshotFile(
        schema=SNAPSHOT_SCHEMA, sequence=state.last_sequence,
        content=zlib.compress(msgspec.msgpack.encode(content), _COMPRESSION_LEVEL)))


def decode_state(data: bytes, kinds: frozenset[str] | None = None) -> ClusterState:
    """The state a snapshot holds, only its views of `kinds` (`FOLDS`' tokens; all when
    None); `SnapshotRejected` for anything else, a snapshot of another code version
    included."""
    try:
        snapshot = msgspec.msgpack.decode(data, type=_SnapshotFile)
    except msgspec.DecodeError as e:
        raise SnapshotRejected(f"not a snapshot: {e}") from e
    if snapshot.schema != SNAPSHOT_SCHEMA:
        raise SnapshotRejected(f"schema {snapshot.schema!r}, this version's is "
                               f"{SNAPSHOT_SCHEMA!r}")
    try:
        with uncollected():
            content = msgspec.msgpack.decode(_inflate(snapshot.content), type=_Content)
            state = _views_of(content, kinds)
    except (msgspec.DecodeError, zlib.error, struct.error, ValueError, TypeError,
            IndexError, RecursionError) as e:
        raise SnapshotRejected(f"{type(e).__name__}: {e}") from e
    state.last_sequence = snapshot.sequence
    state.skipped = Counter(content.skipped)
    return state


def _views_of(content: _Content, kinds: frozenset[str] | None) -> ClusterState:
    """A state of the content's views of `kinds`, in the order they were written."""
    decoded: list[list[msgspec.Struct] | None] = [None] * len(content.structs)
    decoder = _decoder(content.structs, decoded)
    built = []
    try:
        for section in content.views:
            shape = _Shape.of(section)
            built.append(iter([shape.build(row) for row in decoder.decode(section.rows)])
                         if kinds is None or section.kind in kinds else None)
    finally:
        decoded.clear()
    state = ClusterState()
    for index in content.order:
        views = built[index]
        if views is not None:
            view = next(views, None)
            if view is None:
                raise SnapshotRejected(f"order: more views of section {index} than it has")
            state.views[view.id] = view
    if any(next(views, None) is not None for views in built if views is not None):
        raise SnapshotRejected("order: fewer views than the sections hold")
    return state


def _inflate(content: bytes) -> bytes:
    inflater = zlib.decompressobj()
    out = inflater.decompress(content, MAX_SNAPSHOT_BYTES)
    if inflater.unconsumed_tail:
        raise SnapshotRejected(f"inflates past {MAX_SNAPSHOT_BYTES} bytes")
    if not inflater.eof:
        raise SnapshotRejected("compressed content cut short")
    return out


class _Shape:
    """A view class as this version makes one: its attributes in the snapshot's order, and
    the type of each whose fresh value is not None. A row of another shape is refused; the
    types of a row once checked are known good (a fleet's rows have a few shapes)."""

    def __init__(self, cls: type[View], fresh: dict[str, Any]) -> None:
        self.cls, self.keys = cls, list(fresh)
        self.types = [None if v is None else type(v) for v in fresh.values()]
        self.checked: set[tuple[type, ...]] = set()

    @classmethod
    def of(cls, section: _RowSection) -> _Shape:
        view_class = fold_of(section.kind)
        fresh = vars(view_class("")) if view_class is not None else {}
        if view_class is None or section.keys != list(fresh):
            raise SnapshotRejected(f"not a view as this version makes one: {section.kind!r} "
                                   f"with {section.keys!r}"[:200])
        return cls(view_class, fresh)

    def build(self, values: list[Any]) -> View:
        types = tuple(map(type, values))
        if types not in self.checked:
            if len(values) != len(self.keys) or any(
                    expected is not None and actual is not expected
                    for actual, expected in zip(types, self.types, strict=True)):
                raise SnapshotRejected(f"a row that is no {self.cls.__name__} of this "
                                       f"version: {values[:1]!r}")
            self.checked.add(types)
        view = self.cls.__new__(self.cls)
        vars(view).update(zip(self.keys, values, strict=True))
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

    async def latest(self, at_most: int | None = None,
                     kinds: frozenset[str] | None = None) -> ClusterState | None:
        """The newest snapshot this version can trust at or before sequence `at_most`
        (any, when None), with its views of `kinds` only (all, when None: a reader that
        renders one kind needs only what that reads); None when there is none (the log is
        folded from its start)."""
        try:
            infos = await retry_within(self._listed, "snapshots listed", SNAPSHOT_LIST_SECONDS)
        except (TimeoutError, NatsError) as e:
            log.warning("snapshots not listed; the log is folded from its start",
                        error=describe(e))
            return None
        candidates: list[tuple[int, ObjectInfo]] = []
        for info in infos:
            name = info.name or ""
            sequence = _sequence_of(name)
            if sequence is None:
                self._ignore(name, FOREIGN, "another code version's, or no snapshot's name")
            elif at_most is None or sequence <= at_most:
                candidates.append((sequence, info))
        candidates.sort(key=lambda candidate: candidate[0], reverse=True)
        for sequence, info in candidates[:SNAPSHOT_CANDIDATES]:
            name = info.name or ""
            state = await self._read(info, kinds)
            if state is None:
                continue
            if state.last_sequence != sequence:
                self._ignore(name, CORRUPT, f"holds sequence {state.last_sequence}")
                continue
            return state
        return None

    async def _listed(self) -> list[ObjectInfo]:
        """Every snapshot's info; none when there is no bucket yet or it is empty (what a
        transient failure is not: that is raised, to be asked again)."""
        try:
            return await (await self._bucket()).list(ignore_deletes=True)
        except NotFoundError:  # a failover's passing "stream not found" too: folded from 1
            return []

    async def _read(self, info: ObjectInfo,
                    kinds: frozenset[str] | None = None) -> ClusterState | None:
        name = info.name or ""
        try:
            data = await asyncio.wait_for(self._chunks(info), SNAPSHOT_READ_SECONDS)
        except (TimeoutError, NatsError) as e:
            self._ignore(name, UNREADABLE, describe(e))
            return None
        if data is None:
            self._ignore(name, UNREADABLE, "chunks lost to the ring, or not as its digest says")
            return None
        try:  # off the event loop: a reader's live fold goes on meanwhile
            return await asyncio.to_thread(decode_state, data, kinds)
        except SnapshotRejected as e:
            reason = FOREIGN if str(e).startswith("schema") else CORRUPT
            self._ignore(name, reason, str(e))
            return None

    async def _chunks(self, info: ObjectInfo) -> bytes | None:
        """The object's bytes, read as the object store keeps them (its chunks' subject) by
        batched Direct Get; None when some are gone (the ring drops the oldest chunks first)
        or they are not what its digest says."""
        chunks = await read_all(self.nc, self.layout.read_snapshots_stream,
                                f"$O.{self.layout.read_snapshots_bucket}.C.{info.nuid}")
        data = b"".join(msg.data for msg in chunks)
        digest = (info.digest or "").partition("=")[2]
        if len(chunks) != info.chunks or len(data) != info.size or \
                base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode() != digest:
            return None
        return data

    def _ignore(self, name: str, reason: str, detail: str) -> None:
        self.ignored[reason] += 1
        log.warning("snapshot ignored", name=name, reason=reason, detail=detail,
                    ignored=self.ignored[reason])


async def restore(snapshots: Snapshots, state: ClusterState, at_most: int | None = None, *,
                  announce: bool = True, kinds: frozenset[str] | None = None) -> int:
    """Make `state` (an empty one, which others may hold already) the newest usable
    snapshot at or before `at_most` (its views of `kinds` only, see `Snapshots.latest`);
    the first sequence left to fold. A process's start `announce`s it (an info line); a
    point-in-time read, done per query, logs it at debug."""
    found = await snapshots.latest(at_most, kinds)
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
