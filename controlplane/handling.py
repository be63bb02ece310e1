"""Command handling: decide on the writer's memory, append atomically with the command's
marker and its read guards, and give exactly one outcome per command id, final.

A decision is a synchronous handler over views. It runs on what the writer already holds
(`Memory`); when it asks for an object the memory lacks, the object is read from the log
and the handler runs again from the start, so handlers stay plain functions and a warm
command costs no read. The memory is a cache and the server is the judge: every batch
carries, for each object the decision wrote *or read*, the sequence it saw.

| message of the batch                  | subject                    | expects                 |
|---------------------------------------|----------------------------|-------------------------|
| the marker (`CommandAccepted` with its | `ev.command._.<id>`        | 0: no outcome yet (or   |
| event count, or `CommandRejected`)    |                            | past a stray stored     |
|                                       |                            | there)                  |
| each event, in the decision's order   | its object's subject       | the first of each       |
|                                       |                            | object: the sequence    |
|                                       |                            | the decision saw        |
| a read guard per object only read     | `guard` (outside `ev.>`)   | that object's subject   |
| (absent ones too), and per kind (or   |                            | (or `ev.<kind>.>`, or   |
| kind in a namespace) scanned          |                            | `ev.<kind>.<ns>.>`) at  |
|                                       |                            | the sequence seen       |

A decision whose batch would be exactly [marker, one event] (one event, on the one object
it read, no scan) is stored without a batch, which the server stages and syncs (~3.3 ms
here, against ~0.3 ms for a plain publish): the event alone, guarded by its object's
expected sequence and marked `marker_follows`, then the marker, a plain publish naming the
event's sequence (`CommandAccepted.sequences`), expecting its subject as above. The event
goes only for a command with no marker: its marker's subject is looked up while it is
decided (and a marker folded or stored since, `Memory.marked`, counts too), for a command
delivered again must not cause a second change, and a lone event carries no guard of the
marker. Between the two the event is the command's record: the memory keeps every
`marker_follows` event whose marker it has not seen (`Memory.unmarked`, complete once the
control loop folded the whole log, which the intake waits for), and a command found there,
before or after its decision, gets the missing marker, accepted with that sequence, and no
decision (an object read again from the log feeds `unmarked` too, so an event whose publish
went unanswered is found when the command is decided again). Only a complete memory takes
this path. Everything else is one atomic batch. Either way:

| the server answers                     | then                                              |
|----------------------------------------|---------------------------------------------------|
| stored                                 | the memory takes the decision's views; outcome    |
| conflict, and the marker exists        | the first outcome is the answer                   |
| conflict, no marker                    | forget what went stale, decide again (bounded),   |
|                                        | the marker past whatever else its subject holds   |
| no answer (timeout, connection lost)   | settle by the marker; none: decide again          |

Refusals are recorded like acceptances, so a command refused once is refused for good,
however its object changes later and however late it is delivered again. An entry on a
marker's subject that is no well-formed marker of that command (a stray: a reply aimed there,
a copy, another event) is skipped loudly and counted by every reader of the log
(`projections.follower.read_event`), and the marker is appended past it, as an object's
events are appended past a stray on the object's subject.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import msgspec
import structlog
from eventsourcing.persistence import PersistenceError
from nats.aio.msg import Msg

from controlplane.aggregate import Aggregate, Cause
from events.api.errors import InvalidSpec, VirtbusError
from events.api.manifest import decode_object
from events.jetstream.datastore import (
    AppendConflict,
    EventLog,
    OutcomeUnknown,
    Outgoing,
    event_headers,
)
from events.jetstream.directget import LastLookups, sequence
from events.jetstream.groupcommit import GroupCommit
from events.language.codec import Event, encode_kept
from events.language.messages import (
    MAX_ID_LENGTH,
    MAX_NAME_LENGTH,
    MAX_TOKEN_LENGTH,
    Command,
    CommandAccepted,
    CommandRejected,
    Outcome,
    check_envelope,
    marker_aggregate,
)
from events.language.subjects import aggregate_id, encode_token
from projections.cluster import VIEW_KINDS
from projections.follower import first_outcome, read_event
from projections.views import View

log = structlog.get_logger(__name__)

V = TypeVar("V", bound=View)
Obj = TypeVar("Obj")
MAX_ATTEMPTS = 10
"""Decisions of one command that may meet a conflict before it is refused as too busy."""
CONFLICT_BACKOFF_SECONDS = 0.001
"""The first pause after a conflict, doubled per attempt, with jitter: two writers that
keep meeting on one object (replicas across a handover) stop meeting in step."""
MAX_READS = 256
"""Objects one decision may read from the log (a scan counts one)."""
RECENT_MARKERS = 4096
"""Commands whose markers the memory remembers having folded lately (`Memory.marked`)."""


class Rejected(VirtbusError):
    """The command is well-formed but not possible now; `reason` says what to do."""

    def __init__(self, reason: str, field: str = "") -> None:
        self.reason = reason
        self.field = field
        super().__init__(reason)


class _NotLoaded(Exception):
    """The decision needs an object the memory does not hold (control flow, not an error)."""

    def __init__(self, agg_id: str, view_cls: type[View]) -> None:
        self.agg_id = agg_id
        self.view_cls = view_cls


class _NotScanned(Exception):
    """The decision needs every object of a kind, or of a kind in one namespace (`kind` is
    then `<kind>.<namespace token>`, the aggregate ids' prefix) (control flow, not an
    error)."""

    def __init__(self, kind: str, view_cls: type[View]) -> None:
        self.kind = kind
        self.view_cls = view_cls


class Scan(msgspec.Struct, frozen=True):
    """Every aggregate of one kind, listed when the log's newest event of that kind was
    `sequence`: the guard that no object of the kind changed since."""

    ids: list[str]
    sequence: int


def marker_id(command: Command) -> str:
    """The id of a command's marker aggregate, `command._.<id>`."""
    return marker_aggregate(command.id)


class CommandView(View):
    """A command's marker aggregate: it exists once the command has an outcome."""

    def mutate(self, event: Event) -> None:
        self.exists = True


class Memory:
    """The writer's objects, each view as of the newest event this process knows of it
    (`View.last_sequence`). A cache: a stale view costs a conflict, never a wrong write.

    Once it has folded the whole log (`complete`: the control loop feeds it every event it
    replays and follows), an object it lacks is taken as absent without a read; the
    decision's guard (no event on that object's subject) checks that on the server."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.views: dict[str, View] = {}
        self.complete = False
        self._stale: set[str] = set()
        self.position = 0
        """The sequence of the newest event the control loop has fed in (`observe`)."""
        self.unmarked: dict[str, tuple[str, int]] = {}
        """Command id -> (aggregate, sequence) of an event stored alone before its
        command's marker (`marker_follows`) whose marker is not in the log as far as this
        memory knows: a writer stopped between the two, or this one while it appends the
        marker (`_publish_alone`). Entries leave when the marker is observed or stored here;
        complete (`complete`) once the whole log is folded. The live follow brings no
        markers, so another writer's marker stored past the catch-up (a leader that lost
        its lease, still finishing) leaves its entry: that command, delivered here again,
        meets the marker on the marker's subject and answers it."""
        self.marked: dict[str, None] = {}
        """The command ids of the markers folded or stored here last (at most
        `RECENT_MARKERS`, oldest first): a marker stored by another writer after this one
        looked for it, and folded before it decided, is known here."""
        self._marked_ahead: dict[str, int] = {}
        """Command id -> sequence of its event stored alone, for each marker this writer
        stored before the control loop folded that event: the live follow brings no
        markers back (`controlplane.loop`), so the event, folded later, must not be taken
        for one still waiting for its marker. An entry the follow has passed without it
        (none should be) goes at the next sweep."""
        self._sweep_at = RECENT_MARKERS
        self._scopes: dict[str, _Scope] = {}
        """Scan scopes (`Decision.all_existing`) answered from the views so far, each kept
        up to date as views arrive: its objects, and the newest sequence among them."""

    def get(self, agg_id: str, view_cls: type[V]) -> V | None:
        """The view to decide on, or None when it has to be read from the log first."""
        view = self.views.get(agg_id)
        if view is None and self.complete and agg_id not in self._stale:
            return view_cls(agg_id)
        return view if isinstance(view, view_cls) else None

    def observe(self, event: Event, sequence: int) -> None:
        """Fold an event from the log (its own writes come back too, and change nothing)."""
        self.position = max(self.position, sequence)
        if isinstance(event, CommandAccepted | CommandRejected):
            self._mark(event.command_id)
            return
        if event.marker_follows and self._marked_ahead.get(event.causation_id) == sequence:
            del self._marked_ahead[event.causation_id]  # its marker is stored already
        else:
            self._note_unmarked(event, sequence)
        view = self.views.get(event.originator_id)
        if view is None:
            if event.originator_id in self._stale:
                # Forgotten after a conflict: a view folded from this event alone would be
                # its last sequence without its history (a VMI scheduled, never created),
                # and pass its guard. It is read whole from the log when next needed.
                return
            view_cls = VIEW_KINDS.get(event.originator_id.split(".", 1)[0])
            if view_cls is None:
                return
            view = self.views[event.originator_id] = view_cls(event.originator_id)
        view.apply(event, sequence)
        self._indexed(event.originator_id, sequence)

    async def load(self, agg_id: str, view_cls: type[View]) -> View:
        """Read the object's events from the log and keep the view folded from them. The
        view's sequence is its subject's last, whatever is stored there: a message that is
        no event (skipped, logged) still moves the subject on, and the next append to it
        must expect that message, or it conflicts on every attempt."""
        layout = self.log.layout
        view = view_cls(agg_id)
        for msg in await self.log.read_all(layout.events_stream,
                                           layout.aggregate_subject(agg_id)):
            event = read_event(msg)
            if event is not None:
                view.apply(event, sequence(msg))
                if sequence(msg) > self.position:  # observed later, its marker too
                    self._note_unmarked(event, sequence(msg))
            view.last_sequence = sequence(msg)
        self.keep(view)
        self._stale.discard(agg_id)
        return view

    def keep(self, view: View) -> None:
        """Hold `view` as the newest known of its object (read from the log, or written)."""
        self.views[view.id] = view
        self._indexed(view.id)

    def scan(self, scope: str) -> Scan | None:
        """Every object of a scan scope (`<kind>` or `<kind>.<namespace token>`) as the
        views have it, guarded at the newest sequence among them; None where the memory
        cannot tell (not complete, a kind it holds no views of, an object of the scope
        forgotten as stale). Behind the log, the guard meets a conflict and the decision
        scans the log (`CommandHandler._scan`).

        The guard's sequence is one the control loop has folded (`position`) or a scan of
        the log returned, never a write of this process's own not folded yet: every object
        with an event up to it is then in the scope, and the guard holds the rest."""
        known = self._scopes.get(scope)
        if known is None:
            prefix = scope + "."
            if not self.complete or scope.partition(".")[0] not in VIEW_KINDS \
                    or any(agg_id.startswith(prefix) for agg_id in self._stale):
                return None
            known = self._scopes[scope] = _Scope()
            for agg_id, view in self.views.items():
                if agg_id.startswith(prefix):
                    known.take(agg_id, view.last_sequence
                               if view.last_sequence <= self.position else None)
        return Scan(list(known.ids), known.newest)

    def scanned(self, scope: str, found: Scan) -> None:
        """A scan read from the log: what the scope's index lacked, it has now."""
        known = self._scopes.get(scope)
        if known is not None:
            for agg_id in found.ids:
                known.ids[agg_id] = None
            known.newest = max(known.newest, found.sequence)

    def _indexed(self, agg_id: str, folded: int | None = None) -> None:
        """An object's view changed (by the event folded at `folded`): the scan scopes it
        is in hold it (and move to that sequence)."""
        if not self._scopes:
            return
        kind, _, rest = agg_id.partition(".")
        for scope in (kind, f"{kind}.{rest.partition('.')[0]}"):
            known = self._scopes.get(scope)
            if known is not None:
                known.take(agg_id, folded)

    def stored_marker(self, command_id: str, event_sequence: int | None = None) -> None:
        """This writer stored `command_id`'s marker (recording its event stored alone at
        `event_sequence`, if any): known at once, since the live follow does not bring it
        back."""
        self._mark(command_id)
        if event_sequence is not None and event_sequence > self.position:
            self._marked_ahead[command_id] = event_sequence
            if len(self._marked_ahead) >= self._sweep_at:  # amortised: its size doubles
                self._marked_ahead = {c: seq for c, seq in self._marked_ahead.items()
                                      if seq > self.position}
                self._sweep_at = max(RECENT_MARKERS, 2 * len(self._marked_ahead))

    def _mark(self, command_id: str) -> None:
        self.unmarked.pop(command_id, None)
        self.marked[command_id] = None
        if len(self.marked) > RECENT_MARKERS:
            del self.marked[next(iter(self.marked))]

    def _note_unmarked(self, event: Event, sequence: int) -> None:
        if event.marker_follows and self._marked_ahead.get(event.causation_id) != sequence:
            self.unmarked[event.causation_id] = (event.originator_id, sequence)

    def forget(self, agg_id: str, seen: int) -> None:
        """Drop a view the server says is stale (unless it moved on since `seen`): the next
        decision that needs it reads it from the log."""
        view = self.views.get(agg_id)
        if view is None or view.last_sequence == seen:
            self.views.pop(agg_id, None)
            self._stale.add(agg_id)


class _Scope:
    """One scan scope's objects (in the order the memory met them) and the newest sequence
    among them."""

    def __init__(self) -> None:
        self.ids: dict[str, None] = {}
        self.newest = 0

    def take(self, agg_id: str, folded: int | None) -> None:
        self.ids[agg_id] = None
        if folded is not None:
            self.newest = max(self.newest, folded)


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
                raise _NotLoaded(agg_id, view_cls)
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
            raise _NotScanned(scope, view_cls)
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


class Result:
    """An outcome and, when accepted here and now, the events with their stream sequences."""

    def __init__(self, outcome: Outcome, events: list[tuple[int, Event]] | None = None) -> None:
        self.outcome = outcome
        self.events = events or []
        self.announced = False
        """Whether `execute`'s `announce` was told already (before the marker was appended)."""


Announce = Callable[[Outcome], Awaitable[None]]
"""Told a command's outcome once it is final (e.g. the intake's put to the outcomes bucket)."""


async def nobody(_outcome: Outcome) -> None:
    """No one to announce to."""


class Verdict(msgspec.Struct, frozen=True):
    """A refusal: what to do about it, and which field it concerns."""

    reason: str
    field: str = ""


class CommandHandler:
    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.memory = Memory(log)
        self.commits = GroupCommit(log)
        self.markers = LastLookups(log.nc, log.layout.events_stream)
        """Look-ups of commands' markers, those of one turn asked together."""

    async def execute(self, command: Command, announce: Announce = nobody) -> Result:
        """Decide and record exactly once; a command that already has an outcome gets it.
        `announce` is told the outcome once it is final: once recorded, or, for an event
        stored alone, as soon as the event is (before its marker is appended: the marker can
        only record that outcome). Returns once both are done.

        Raises only what the log raised while it could not be read or written (the caller
        leaves the command to be delivered again): never for what the command holds."""
        result = await self._decided(command, announce)
        if not result.announced:
            await announce(result.outcome)
        return result

    async def _decided(self, command: Command, announce: Announce) -> Result:
        bound = log.bind(command_id=command.id, kind=command.kind, verb=command.verb,
                         name=command.name, namespace=command.namespace, actor=command.actor,
                         correlation_id=command.correlation_id or command.id)
        try:
            check_envelope(command)
        except InvalidSpec as e:
            return await self.record_refusal(command, Verdict(e.rule, e.field))
        # Looked up while the command is decided: a lone event must not be stored for a
        # command that has an outcome (an atomic batch holds the marker's own guard).
        looked_up = self.markers.last_on(self.log.layout.aggregate_subject(marker_id(command)))
        looked_up.add_done_callback(_retrieved)
        try:
            return await self._execute(command, looked_up, announce, bound)
        finally:
            looked_up.cancel()

    async def _execute(self, command: Command, looked_up: asyncio.Future[Msg | None],
                       announce: Announce, bound: Any) -> Result:
        scans: dict[str, Scan] = {}
        marker_at = 0
        """The last sequence on the marker's subject: 0, or a stray's."""
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                await asyncio.sleep(random.uniform(0, CONFLICT_BACKOFF_SECONDS * 2 ** attempt))
            if (stored := self.memory.unmarked.get(command.id)) is not None:
                return await self._mark_stored(command, stored[1], bound)
            # After a conflict, scans are read from the log: the memory may be behind.
            decision, verdict = await self._decide(command, scans, bound, fresh=attempt > 0)
            if (stored := self.memory.unmarked.get(command.id)) is not None:  # read on the way
                return await self._mark_stored(command, stored[1], bound)
            alone = self._alone(decision, verdict)
            if alone is not None and (command.id in self.memory.marked
                                      or (attempt == 0 and await looked_up is not None)):
                prior, marker_at = await self.prior(command)
                if prior is not None:
                    bound.info("command already has an outcome")
                    return prior
            try:
                if alone is not None:
                    return await self._publish_alone(decision, alone, announce, bound)
                seqs = await self.commits.publish(self._batch(decision, verdict, marker_at))
                self.memory.stored_marker(command.id)
            except (AppendConflict, OutcomeUnknown) as e:
                prior, marker_at = await self.prior(command)
                if prior is not None:
                    bound.info("command already has an outcome")
                    return prior
                bound.debug("conflict, deciding again on fresh state", error=str(e))
                for agg_id, seen in decision.seen.items():
                    self.memory.forget(agg_id, seen)
                scans.clear()
                continue
            except PersistenceError as e:  # the log refuses these events as they are
                return await self.record_refusal(
                    command, Verdict(f"the log refused this command's events: {e}"))
            return self._recorded(decision, verdict, seqs[1:1 + len(decision.events)], bound)
        return await self.record_refusal(
            command, Verdict("the object kept changing concurrently; retry"))

    async def record_refusal(self, command: Command, verdict: Verdict) -> Result:
        """Refuse `command` for good without deciding it (e.g. it claims another actor)."""
        decision = Decision(self.memory, command, {})
        recorded = await self._publish_marker(
            command, lambda marker_at: self._batch(decision, verdict, marker_at))
        if isinstance(recorded, Result):
            return recorded
        return self._recorded(decision, verdict, [], log.bind(command_id=command.id))

    def _alone(self, decision: Decision, verdict: Verdict | None) -> Outgoing | None:
        """The decision's one event, to be stored alone (a plain publish, guarded by its
        object's expected sequence) and its marker after it, when that is all its atomic
        batch would hold: one event, on the one object it read, no scan. Only on a complete
        memory, which knows every such event still waiting for its marker (`unmarked`)."""
        events = decision.events
        if verdict is not None or decision.scanned or not self.memory.complete \
                or len(events) != 1 or decision.seen.keys() != {events[0].originator_id}:
            return None
        event = msgspec.structs.replace(events[0], marker_follows=True)
        return _message(self.log.layout.aggregate_subject(event.originator_id), event,
                        decision.seen[event.originator_id])

    async def _publish_alone(self, decision: Decision, alone: Outgoing, announce: Announce,
                             bound: Any) -> Result:
        """The event, the outcome announced, then its marker naming the event's sequence:
        once the event is stored, the command's outcome is that event (another writer at
        the same command decided on the same object, so its write met this one's guard, or
        it found this event and records the same). Until the marker is stored, the memory
        holds the event as unmarked: a retry in this process (the intake works a command
        again in place when its marker got no answer) is settled by `_mark_stored`, as after
        a writer stopped between the two, not decided again on a memory that holds the
        event already (an `apply` would be a no-op, a second outcome)."""
        [seq] = await self.log.publish([alone])
        command = decision.command
        self.memory.unmarked[command.id] = (decision.events[0].originator_id, seq)
        result = self._recorded(decision, None, [seq], bound)
        marker = self._marker(decision, None, [seq])
        await announce(result.outcome)  # final already; the intake awaits no ack for it
        result.announced = True
        recorded = await self._publish_marker(command, lambda marker_at: [_message(
            self.log.layout.aggregate_subject(marker.originator_id), marker, marker_at)], seq)
        if isinstance(recorded, Result) and recorded.outcome != result.outcome:
            bound.error("another outcome was recorded first for a command whose event is "
                        "stored; it stands", recorded=recorded.outcome, stored=result.outcome)
            await announce(recorded.outcome)
            recorded.announced = True
            return recorded
        return result

    async def _mark_stored(self, command: Command, seq: int, bound: Any) -> Result:
        """Answer a command whose one event is stored (at `seq`) and whose marker may not
        be: append the marker, accepted with that sequence, unless one is there first."""
        decision = Decision(self.memory, command, {})
        marker = self._marker(decision, None, [seq])
        recorded = await self._publish_marker(
            command, lambda marker_at: [_message(
                self.log.layout.aggregate_subject(marker.originator_id), marker, marker_at)],
            seq)
        if isinstance(recorded, Result):
            return recorded
        bound.info("command accepted: its event was stored before its marker", sequences=[seq])
        return Result(Outcome(command_id=command.id, accepted=True, sequences=[seq]))

    async def _publish_marker(self, command: Command,
                              messages_at: Callable[[int], list[Outgoing]],
                              event_sequence: int | None = None) -> list[int] | Result:
        """Store a batch that leads with the command's marker, expecting the marker's
        subject at `marker_at` (0, or past a stray): its sequences, or the command's first
        outcome when a marker is there already. Either way the memory knows the command
        has its marker (and that its event stored alone at `event_sequence` has too)."""
        marker_at = 0
        for _attempt in range(MAX_ATTEMPTS):
            try:
                stored = await self.commits.publish(messages_at(marker_at))
                self.memory.stored_marker(command.id, event_sequence)
                return stored
            except (AppendConflict, OutcomeUnknown):
                prior, last = await self.prior(command)
                if prior is not None:
                    self.memory.stored_marker(command.id, event_sequence)
                    return prior
                if last == marker_at:  # no answer, and nothing stored: unknown
                    raise
                marker_at = last  # past a stray
        raise OutcomeUnknown(f"command {command.id}: its marker's subject kept moving")

    async def _decide(self, command: Command, scans: dict[str, Scan], bound: Any,
                      fresh: bool = False) -> tuple[Decision, Verdict | None]:
        """Run the handler until it needs nothing the memory lacks; its verdict."""
        handler = HANDLERS.get((command.kind, command.verb))
        for _read in range(MAX_READS):
            decision = Decision(self.memory, command, scans)
            if handler is None:
                return decision, Verdict(f"{command.kind} does not support {command.verb!r}",
                                         "verb")
            try:
                handler(decision)
            except _NotLoaded as missing:
                await self.memory.load(missing.agg_id, missing.view_cls)
                continue
            except _NotScanned as missing:
                scans[missing.kind] = await self._scan(missing.kind, missing.view_cls, fresh)
                continue
            except InvalidSpec as e:
                return decision, Verdict(e.rule, e.field)
            except Rejected as e:
                return decision, Verdict(e.reason, e.field)
            except Exception as e:  # a bug met by this command: refuse it, keep serving
                bound.exception("command could not be decided")
                return decision, Verdict(f"the control plane could not decide this command "
                                         f"({type(e).__name__}); it changed nothing")
            return decision, None
        return decision, Verdict("the command needs more objects than one decision reads")

    async def _scan(self, kind: str, view_cls: type[View], fresh: bool) -> Scan:
        """Every object of `kind` (`<kind>.<namespace token>`: of one namespace) and the
        sequence they are guarded at: as the memory has them (no read), unless it cannot
        tell or `fresh` asks for the log's."""
        if not fresh and (known := self.memory.scan(kind)) is not None:
            return known
        layout = self.log.layout
        subject = layout.events_filter(kind)
        newest = await self.log.last_on(layout.events_stream, subject)
        root = layout.events_root
        ids = [s[len(root) + 1:] for s in
               await self.log.subjects(layout.events_stream, subject)]
        for agg_id in ids:
            await self.memory.load(agg_id, view_cls)
        found = Scan(ids, sequence(newest) if newest is not None else 0)
        self.memory.scanned(kind, found)
        return found

    def _marker(self, decision: Decision, verdict: Verdict | None,
                sequences: list[int] | None = None) -> Event:
        """The command's outcome marker: refused, or accepted with its events (that follow
        it in its batch, or, `sequences`, that were stored before it)."""
        cmd = decision.command
        marker = Aggregate(CommandView(marker_id(cmd)))
        common = {"command_id": cmd.id, "kind": cmd.kind[:MAX_TOKEN_LENGTH],
                  "verb": cmd.verb[:MAX_TOKEN_LENGTH], "target": cmd.name[:MAX_NAME_LENGTH]}
        if verdict is not None:
            return marker.trigger(decision.cause, CommandRejected, reason=verdict.reason,
                                  field=verdict.field, **common)
        if sequences:
            return marker.trigger(decision.cause, CommandAccepted, event_count=len(sequences),
                                  sequences=sequences, **common)
        return marker.trigger(decision.cause, CommandAccepted,
                              event_count=len(decision.events), **common)

    def _batch(self, decision: Decision, verdict: Verdict | None,
               marker_at: int = 0) -> list[Outgoing]:
        layout = self.log.layout
        marker = self._marker(decision, verdict)
        events = decision.events if verdict is None else []
        out = [_message(layout.aggregate_subject(marker.originator_id), marker, marker_at)]
        written: set[str] = set()
        for event in events:
            agg_id = event.originator_id
            first = agg_id not in written
            written.add(agg_id)
            out.append(_message(layout.aggregate_subject(agg_id), event,
                                decision.seen[agg_id] if first else None))
        for agg_id, seen in decision.seen.items():
            if agg_id not in written:
                out.append(Outgoing(layout.guard_subject, b"", {}, seen,
                                    layout.aggregate_subject(agg_id)))
        for kind in decision.scanned:
            out.append(Outgoing(layout.guard_subject, b"", {}, decision.scans[kind].sequence,
                                layout.events_filter(kind)))
        return out

    def _recorded(self, decision: Decision, verdict: Verdict | None, event_seqs: list[int],
                  bound: Any) -> Result:
        """The outcome of a decision the log took, its events at `event_seqs`; the memory
        takes the decision's views."""
        cmd = decision.command
        if verdict is not None:
            bound.info("command rejected", field=verdict.field, reason=verdict.reason)
            return Result(Outcome(command_id=cmd.id, accepted=False, reason=verdict.reason,
                                  field=verdict.field))
        events = decision.events
        for seq, event in zip(event_seqs, events, strict=True):
            view = decision.touched[event.originator_id].state
            view.last_sequence = seq
        for agg in decision.touched.values():
            if agg.pending:
                agg.collect_events()
                self.memory.keep(agg.state)
        bound.info("command accepted", sequences=event_seqs)
        return Result(Outcome(command_id=cmd.id, accepted=True, sequences=event_seqs),
                      list(zip(event_seqs, events, strict=True)))

    async def prior(self, command: Command) -> tuple[Result | None, int]:
        """The first outcome of this command, from its marker in the log, if it has one; and
        the last sequence on the marker's subject, which a marker appended now must expect:
        0, or that of a stray stored there (skipped, logged and counted by `read_event`)."""
        layout = self.log.layout
        stored = await self.log.read_all(layout.events_stream,
                                         layout.aggregate_subject(marker_id(command)))
        found = first_outcome(stored)
        if found is not None:
            return Result(found[0]), found[1]
        return None, sequence(stored[-1]) if stored else 0


def _retrieved(done: asyncio.Future[Msg | None]) -> None:
    """Take a look-up's error, if any: the decision went on without it (an atomic batch)."""
    if not done.cancelled():
        done.exception()


def _message(subject: str, event: Event, expect: int | None) -> Outgoing:
    return Outgoing(subject, encode_kept(event),
                    event_headers(event.id, event.topic(), event.originator_version),
                    expect)
