"""Aggregates: a view (the state, shared with the read side) plus the events a decision adds.

They satisfy the `eventsourcing` aggregate protocol (`id`, `version`, `collect_events`), so
the library's Application and Repository store and load them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

import msgspec

from events.language.codec import Event, now
from projections.views import View

V = TypeVar("V", bound=View)
E = TypeVar("E", bound=Event)


class Cause(msgspec.Struct, frozen=True):
    """Who asked, and which command: stamped on every event a decision makes."""

    actor: str
    command_id: str
    correlation_id: str


class Aggregate(Generic[V]):
    def __init__(self, view: V) -> None:
        self.state = view
        self._pending: list[Event] = []

    @property
    def id(self) -> str:
        return self.state.id

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def exists(self) -> bool:
        return self.state.exists

    def trigger(self, cause: Cause, event_cls: type[E], **fields: Any) -> E:
        event = event_cls(
            originator_id=self.id,
            originator_version=self.version + 1,
            timestamp=now(),
            actor=cause.actor,
            correlation_id=cause.correlation_id,
            causation_id=cause.command_id,
            **fields,
        )
        self.state.apply(event)
        self._pending.append(event)
        return event

    def collect_events(self) -> list[Event]:
        events, self._pending = self._pending, []
        return events

    @property
    def pending(self) -> list[Event]:
        return list(self._pending)


def projector(view_cls: type[V]) -> Any:
    """A projector function for the library's Repository: fold stored events into a view."""

    def project(initial: Aggregate[V] | None, events: Iterable[Event]) -> Aggregate[V] | None:
        aggregate = initial
        for event in events:
            if aggregate is None:
                aggregate = Aggregate(view_cls(event.originator_id))
            aggregate.state.apply(event)
        return aggregate

    return project
