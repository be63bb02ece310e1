"""The write protocols: run a command's decision (`controlplane.decision`) on the writer's
memory (`controlplane.memory`), append it with the command's marker and its read guards,
and give exactly one outcome per command id, final.

The memory is a cache and the server is the judge: every batch carries, for each object
the decision wrote *or read*, the sequence it saw.

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
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog
from eventsourcing.persistence import PersistenceError
from nats.aio.msg import Msg

from controlplane.aggregate import Aggregate
from controlplane.decision import (
    Decision,
    NotLoaded,
    NotScanned,
    Rejected,
    Verdict,
)
from controlplane.handlers import handler_for
from controlplane.memory import Memory, Scan
from events.api.errors import InvalidSpec
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
    MAX_NAME_LENGTH,
    MAX_TOKEN_LENGTH,
    Command,
    CommandAccepted,
    CommandRejected,
    Outcome,
    check_envelope,
    marker_aggregate,
)
from projections.follower import first_outcome
from projections.views import View

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 10
"""Decisions of one command that may meet a conflict before it is refused as too busy."""
CONFLICT_BACKOFF_SECONDS = 0.001
"""The first pause after a conflict, doubled per attempt, with jitter: two writers that
keep meeting on one object (replicas across a handover) stop meeting in step."""
MAX_READS = 256
"""Objects one decision may read from the log (a scan counts one)."""


def marker_id(command: Command) -> str:
    """The id of a command's marker aggregate, `command._.<id>`."""
    return marker_aggregate(command.id)


class CommandView(View):
    """A command's marker aggregate: it exists once the command has an outcome."""

    def mutate(self, event: Event) -> None:
        self.exists = True


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
        handler = handler_for(command.kind, command.verb)
        for _read in range(MAX_READS):
            decision = Decision(self.memory, command, scans)
            if handler is None:
                return decision, Verdict(f"{command.kind} does not support {command.verb!r}",
                                         "verb")
            try:
                handler(decision)
            except NotLoaded as missing:
                await self.memory.load(missing.agg_id, missing.view_cls)
                continue
            except NotScanned as missing:
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
