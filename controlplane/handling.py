"""Command handling: decide on fresh state, append atomically with the command's marker,
and give exactly one outcome per command id.

The marker is a `CommandAccepted` event on the command's own aggregate, `command._.<id>`,
appended in the same atomic batch as the decision's events. The store lets that aggregate
be created once, so a command delivered twice (a crash before its ack, a client retry) is
recognised and answered with its first outcome instead of being applied again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import IntegrityError, Mapper

from controlplane.aggregate import Aggregate, Cause, projector
from events.api.manifest import decode_object
from events.codec import Event, EventMapper
from events.errors import InvalidSpec, VirtbusError
from events.jetstream import JetStreamApplicationRecorder
from events.messages import COMMAND_KIND, Command, CommandAccepted, Outcome
from events.subjects import aggregate_id
from projections.views import View

log = structlog.get_logger(__name__)

V = TypeVar("V", bound=View)
Obj = TypeVar("Obj")
MAX_ATTEMPTS = 5


class Rejected(VirtbusError):
    """The command is well-formed but not possible now; `reason` says what to do."""

    def __init__(self, reason: str, field: str = "") -> None:
        self.reason = reason
        self.field = field
        super().__init__(reason)


def marker_id(command: Command) -> str:
    """The id of a command's marker aggregate, `command._.<id>`."""
    return aggregate_id(COMMAND_KIND, "", command.id)


class CommandView(View):
    """A command's marker aggregate: it exists once the command has been applied."""

    def mutate(self, event: Event) -> None:
        if isinstance(event, CommandAccepted):
            self.exists = True


class VirtbusApplication(Application[str]):
    """The library Application over events.jetstream, with the msgspec mapper."""

    name = "virtbus"

    def construct_mapper(self) -> Mapper[str]:
        return EventMapper(transcoder=self.factory.transcoder(), cipher=self.factory.cipher(),
                           compressor=self.factory.compressor())

    def load(self, agg_id: str, view_cls: type[V]) -> Aggregate[V]:
        try:
            found: Aggregate[V] = self.repository.get(agg_id, projector_func=projector(view_cls))
        except AggregateNotFoundError:
            return Aggregate(view_cls(agg_id))
        return found


class Decision:
    """One attempt at a command: the aggregates it loaded and the events it added."""

    def __init__(self, app: VirtbusApplication, command: Command) -> None:
        self.app = app
        self.command = command
        self.cause = Cause(command.actor, command.id, command.correlation_id or command.id)
        self.touched: dict[str, Aggregate[Any]] = {}

    def load(self, agg_id: str, view_cls: type[V]) -> Aggregate[V]:
        if agg_id not in self.touched:
            self.touched[agg_id] = self.app.load(agg_id, view_cls)
        return self.touched[agg_id]

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
        assert isinstance(obj, cls)
        return obj

    def trigger(self, aggregate: Aggregate[Any], event_cls: type[Event], **fields: Any) -> None:
        aggregate.trigger(self.cause, event_cls, **fields)

    @property
    def events(self) -> list[Event]:
        return [e for agg in self.touched.values() for e in agg.pending]


Handler = Callable[[Decision], None]
HANDLERS: dict[tuple[str, str], Handler] = {}
H = TypeVar("H", bound=Handler)


def handles(kind: str, verb: str) -> Callable[[H], H]:
    def register(fn: H) -> H:
        HANDLERS[(kind, verb)] = fn
        return fn

    return register


class Result:
    """An outcome and, when accepted, the events with their stream sequences."""

    def __init__(self, outcome: Outcome, events: list[tuple[int, Event]] | None = None) -> None:
        self.outcome = outcome
        self.events = events or []


class CommandHandler:
    def __init__(self, app: VirtbusApplication) -> None:
        self.app = app

    def execute(self, command: Command, *, check_prior: bool = False) -> Result:
        """Decide and append once. `check_prior` (commands from clients) answers a command
        already applied with its first outcome before deciding anything on today's state."""
        bound = log.bind(command_id=command.id, kind=command.kind, verb=command.verb,
                         name=command.name, namespace=command.namespace, actor=command.actor,
                         correlation_id=command.correlation_id or command.id)
        handler = HANDLERS.get((command.kind, command.verb))
        if handler is None:
            return self._reject(command, f"{command.kind} does not support {command.verb!r}",
                                "verb")
        if check_prior and (prior := self.prior(command)) is not None:
            bound.info("command already applied")
            return prior
        for _attempt in range(MAX_ATTEMPTS):
            decision = Decision(self.app, command)
            try:
                handler(decision)
            except InvalidSpec as e:
                bound.info("command rejected", field=e.field, reason=e.rule)
                return self._reject(command, e.rule, e.field)
            except Rejected as e:
                bound.info("command rejected", reason=e.reason)
                return self._reject(command, e.reason, e.field)
            events = decision.events
            if not events:
                return Result(Outcome(command_id=command.id, accepted=True))
            marker = Aggregate(CommandView(marker_id(command)))
            marker.trigger(decision.cause, CommandAccepted, command_id=command.id,
                           kind=command.kind, verb=command.verb, target=command.name,
                           event_count=len(events))
            try:
                recordings = self.app.save(marker, *decision.touched.values())
            except IntegrityError:
                prior = self.prior(command)
                if prior is not None:
                    bound.info("command already applied")
                    return prior
                bound.debug("conflict, retrying from fresh state")
                continue
            seqs = [r.notification.id for r in recordings[1:]]
            bound.info("command accepted", sequences=seqs)
            outcome = Outcome(command_id=command.id, accepted=True, sequences=seqs)
            return Result(outcome, list(zip(seqs, events, strict=True)))
        return self._reject(command, "the object kept changing concurrently; retry", "")

    def prior(self, command: Command) -> Result | None:
        """The outcome of an earlier delivery of this command, from its marker in the log.

        The marker leads its atomic batch, whose events are stored contiguously, so the
        command's events are the `event_count` sequences right after it.
        """
        recorder = self.app.recorder
        assert isinstance(recorder, JetStreamApplicationRecorder)
        position = recorder.last_position(marker_id(command))
        if position is None:
            return None
        _version, marker_seq = position
        [stored] = recorder.select_notifications(marker_seq, 1)
        marker = self.app.mapper.to_domain_event(stored)
        assert isinstance(marker, CommandAccepted)
        seqs = list(range(marker_seq + 1, marker_seq + 1 + marker.event_count))
        return Result(Outcome(command_id=command.id, accepted=True, sequences=seqs))

    @staticmethod
    def _reject(command: Command, reason: str, field: str) -> Result:
        return Result(Outcome(command_id=command.id, accepted=False, reason=reason, field=field))

