"""The writer's memory: every object's view as of the newest event this process knows of
it, a cache the decisions run on (`controlplane.decision`) so that a warm command costs no
read. The server is the judge: a stale view costs a conflict (`controlplane.writeprotocol`),
never a wrong write.

Besides the views it keeps what the write protocols need to know of the log:

| bookkeeping      | what it holds                                                        |
|------------------|----------------------------------------------------------------------|
| `unmarked`       | events stored alone (`marker_follows`) whose command's marker is not  |
|                  | in the log as far as it knows                                         |
| `marked`         | the commands whose markers it folded or stored lately                 |
| `_marked_ahead`  | markers this writer stored before the control loop folded their event |
| `_stale`         | objects forgotten after a conflict: read whole from the log next time |
| `_scopes`        | scan scopes answered from the views, kept up to date as views arrive  |
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from events.jetstream.datastore import EventLog
from events.jetstream.directget import sequence
from events.language.codec import Event
from events.language.messages import CommandAccepted, CommandRejected
from projections.follower import read_event
from projections.kinds import fold_of
from projections.views import View

V = TypeVar("V", bound=View)

RECENT_MARKERS = 4096
"""Commands whose markers the memory remembers having folded lately (`Memory.marked`)."""


class Scan(msgspec.Struct, frozen=True):
    """Every aggregate of one kind, listed when the log's newest event of that kind was
    `sequence`: the guard that no object of the kind changed since."""

    ids: list[str]
    sequence: int


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
        marker (`controlplane.writeprotocol`). Entries leave when the marker is observed or
        stored here; complete (`complete`) once the whole log is folded. The live follow brings no
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
            view_cls = fold_of(event.originator_id.split(".", 1)[0])
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
        scans the log (`controlplane.writeprotocol.CommandHandler._scan`).

        The guard's sequence is one the control loop has folded (`position`) or a scan of
        the log returned, never a write of this process's own not folded yet: every object
        with an event up to it is then in the scope, and the guard holds the rest."""
        known = self._scopes.get(scope)
        if known is None:
            prefix = scope + "."
            if not self.complete or fold_of(scope.partition(".")[0]) is None \
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
