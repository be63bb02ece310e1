"""The command handlers' API: a handler is a plain synchronous function of one `Decision`,
registered for a (kind, verb) with `@handles`. It reads objects (`load`, `target`,
`existing`, `all_existing`), adds events (`trigger`), or refuses (`Rejected`, or
`InvalidSpec` for what the command holds); `apply_namespaced` is the `apply` of a namespaced
object that keeps a uid and a generation.

A decision runs on the writer's memory (`controlplane.memory`). When it asks for an object
(or a scan of a kind) the memory lacks, it stops (`NotLoaded`, `NotScanned`: control flow,
not errors); the object is read from the log and the handler runs again from the start, so
handlers stay plain functions and a warm command costs no read. What it read, at which
sequence, and the events it added are what the write protocols append and guard
(`controlplane.writeprotocol`).

The object a command decides on, as far as its envelope (or an apply's manifest) says, is
named in one place, `command_target`: the writer decides commands with one target one after
another, and its namespace is the key a write side partitioned by namespace would route by
(a decision that scans a kind across namespaces, or a cluster-scoped object, would belong to
a cluster-wide partition).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import msgspec

from controlplane.aggregate import Aggregate, Cause
from events.api.errors import InvalidSpec, VirtbusError
from events.api.manifest import decode_object
from events.language.codec import Event
from events.language.ids import random_uuid
from events.language.messages import MAX_ID_LENGTH, Command
from events.language.subjects import aggregate_id, encode_token
from projections.views import View

if TYPE_CHECKING:
    from controlplane.memory import Memory, Scan
    from events.api.base import ObjectMeta

V = TypeVar("V", bound=View)
Obj = TypeVar("Obj")


class Rejected(VirtbusError):
    """The command is well-formed but not possible now; `reason` says what to do."""

    def __init__(self, reason: str, field: str = "") -> None:
        self.reason = reason
        self.field = field
        super().__init__(reason)


class NotLoaded(Exception):
    """The decision needs an object the memory does not hold (control flow, not an error)."""

    def __init__(self, agg_id: str, view_cls: type[View]) -> None:
        self.agg_id = agg_id
        self.view_cls = view_cls


class NotScanned(Exception):
    """The decision needs every object of a kind, or of a kind in one namespace (`kind` is
    then `<kind>.<namespace token>`, the aggregate ids' prefix) (control flow, not an
    error)."""

    def __init__(self, kind: str, view_cls: type[View]) -> None:
        self.kind = kind
        self.view_cls = view_cls


class Verdict(msgspec.Struct, frozen=True):
    """A refusal: what to do about it, and which field it concerns."""

    reason: str
    field: str = ""


class Decision:
    """One attempt at a command: what it read (at which sequence) and the events it added."""

    def __init__(self, memory: Memory, command: Command, scans: dict[str, Scan]) -> None:
        self.memory = memory
        self.command = command
        # Clipped: a refusal of an over-long envelope still fits in the log.
        self.cause = Cause(command.actor[:MAX_ID_LENGTH], command.id,
                           (command.correlation_id or command.id)[:MAX_ID_LENGTH])
        self.touched: dict[str, Aggregate[Any]] = {}
        self.seen: dict[str, int] = {}
        self.scans = scans
        self.scanned: set[str] = set()

    def load(self, agg_id: str, view_cls: type[V]) -> Aggregate[V]:
        if agg_id not in self.touched:
            view = self.memory.get(agg_id, view_cls)
            if view is None:
                raise NotLoaded(agg_id, view_cls)
            self.touched[agg_id] = Aggregate(view.copy())
            self.seen[agg_id] = view.last_sequence
        found: Aggregate[V] = self.touched[agg_id]
        return found

    def all_existing(self, kind: str, view_cls: type[V],
                     namespace: str = "") -> Iterator[Aggregate[V]]:
        """Every object of `kind` (of `namespace` only, if given) that exists, each loaded
        when the caller gets to it; the decision then depends on no such object changing (a
        wildcard guard)."""
        scope = f"{kind}.{encode_token(namespace)}" if namespace else kind
        scan = self.scans.get(scope)
        if scan is None:
            raise NotScanned(scope, view_cls)
        self.scanned.add(scope)
        for agg_id in scan.ids:
            found = self.load(agg_id, view_cls)
            if found.exists:
                yield found

    def target(self, kind: str, view_cls: type[V]) -> Aggregate[V]:
        """The aggregate the command names (`kind` token, its namespace and name)."""
        return self.load(aggregate_id(kind, self.command.namespace, self.command.name), view_cls)

    def existing(self, kind: str, view_cls: type[V], noun: str) -> Aggregate[V]:
        """The named aggregate, or a refusal that says it does not exist."""
        found = self.target(kind, view_cls)
        if not found.exists:
            cmd = self.command
            raise Rejected(f'{noun} "{cmd.namespace}/{cmd.name}" not found', "metadata.name")
        return found

    def submitted(self, cls: type[Obj]) -> Obj:
        """The object an `apply` carries, decoded and admitted by its schema."""
        if self.command.manifest is None:
            raise InvalidSpec("manifest", "apply needs the object")
        obj = decode_object(self.command.manifest)
        if not isinstance(obj, cls):
            raise InvalidSpec("kind", f"the command is for a {self.command.kind}, "
                                      f"the manifest holds a {type(obj).__name__}")
        return obj

    def body(self, cls: type[Obj]) -> Obj:
        """The command's manifest as `cls` (an internal verb's body), or a refusal naming
        what does not fit."""
        try:
            return msgspec.convert(self.command.manifest or {}, cls)
        except msgspec.ValidationError as e:
            raise InvalidSpec("manifest", str(e)) from None

    def deciding_apply(self, manifest: dict[str, Any], apply: Handler) -> None:
        """Decide `apply` (a kind's apply handler) of `manifest` within this decision (a
        patch's result): the same reads, admission and events as that apply's own, guarded
        with what this decision read before; the command stays itself for its outcome."""
        command = self.command
        self.command = msgspec.structs.replace(command, verb="apply", manifest=manifest)
        try:
            apply(self)
        finally:
            self.command = command

    def trigger(self, aggregate: Aggregate[Any], event_cls: type[Event], **fields: Any) -> None:
        aggregate.trigger(self.cause, event_cls, **fields)

    @property
    def events(self) -> list[Event]:
        return [e for agg in self.touched.values() for e in agg.pending]


Handler = Callable[[Decision], None]
HANDLERS: dict[tuple[str, str], Handler] = {}
H = TypeVar("H", bound=Handler)


INTERNAL_VERBS: set[tuple[str, str]] = set()
"""(kind, verb) pairs only the control plane itself decides: its controllers' commands and
the node reports it turns into commands. The command intake refuses them from anyone."""


def handles(kind: str, verb: str, *, internal: bool = False) -> Callable[[H], H]:
    def register(fn: H) -> H:
        HANDLERS[(kind, verb)] = fn
        if internal:
            INTERNAL_VERBS.add((kind, verb))
        return fn

    return register


def command_target(command: Command) -> tuple[str, str, str]:
    """The object a command decides on (kind, namespace, name), as far as its envelope (or
    an apply's manifest) says: the one place that says which object, and which namespace, a
    command is about."""
    namespace, name = command.namespace, command.name
    manifest: Any = command.manifest
    if command.verb == "apply" and isinstance(manifest, dict):
        meta = manifest.get("metadata")
        if isinstance(meta, dict):
            namespace = str(meta.get("namespace", namespace))
            name = str(meta.get("name", name))
    return command.kind, namespace, name


def target_key(command: Command) -> str:
    """`command_target` as one string: commands with one key are decided one after another,
    in arrival order."""
    kind, namespace, name = command_target(command)
    return f"{kind}/{namespace}/{name}"


class Applicable(Protocol):
    """What an `apply` of a namespaced object carries: its metadata and its spec."""

    @property
    def metadata(self) -> ObjectMeta: ...

    @property
    def spec(self) -> Any: ...


class Applied(Protocol):
    """What the view of such an object keeps of it."""

    uid: str
    metadata: ObjectMeta
    spec: Any
    generation: int


A = TypeVar("A", bound=Applicable)


def apply_namespaced(d: Decision, submitted: type[A], kind: str, view_cls: type[View],
                     applied: type[Event], *,
                     admit_new: Callable[[A], None] | None = None) -> None:
    """The `apply` of a namespaced object with a uid and a generation, as the API server
    has it: the manifest's object (aggregate `<kind>.<namespace>.<name>`) is created (a new
    uid, generation 1) or changed (its uid kept, its generation counting changes of its spec,
    not of its labels or annotations), recorded as one `applied` event (`uid`, `metadata`,
    `spec`, `generation`); an apply that changes none of spec, labels and annotations
    appends nothing. `admit_new` admits an object being created (an admitter that checks
    on CREATE only), refusing it by raising."""
    new = d.submitted(submitted)
    meta = new.metadata
    found = d.load(aggregate_id(kind, meta.namespace, meta.name), view_cls)
    old = cast(Applied, found.state)  # `view_cls` keeps what `Applied` names
    if found.exists:
        if (old.spec, old.metadata.labels, old.metadata.annotations) == (
                new.spec, meta.labels, meta.annotations):
            return
        uid, generation = old.uid, old.generation + (old.spec != new.spec)
    else:
        if admit_new is not None:
            admit_new(new)
        uid, generation = random_uuid(), 1
    d.trigger(found, applied, uid=uid, metadata=meta, spec=new.spec, generation=generation)
