"""Per-object state folded from events. The write side decides on these same views, and the
read side renders them, so what a command was checked against is what `get` shows.

Each view ignores events at or below the version it has seen, so feeding an event twice
(once as a controller's own result, once from the log) changes nothing.

Nothing read from the log is asserted: an event that does not fit its view's state (a
change to a VM never created) is ignored with a warning, and a fold that fails anyway
leaves the view as it was. `mutate` only rebinds attributes, never changes a list, dict or
struct in place, so a shallow copy (`View.copy`) folds apart from its original.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Self

import structlog

from events.api.base import ObjectMeta
from events.language.codec import Event

log = structlog.get_logger(__name__)

class View:
    """Common bookkeeping: which aggregate, at which version, changed when and on whose
    request (the correlation id a controller carries on when it acts on the object later).

    A subclass names the aggregate-id tokens it folds (`class NodeView(View,
    tokens=("node",))`): `FOLDS` is derived from those classes, never listed by hand."""

    FOLDS: ClassVar[dict[str, type[View]]] = {}
    """Aggregate-id token -> the view that folds its events (see `projections.kinds`)."""

    def __init_subclass__(cls, tokens: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for token in tokens:
            if View.FOLDS.setdefault(token, cls) is not cls:
                raise ValueError(f"{token!r} is folded by {View.FOLDS[token].__name__} already")

    def __init__(self, aggregate_id: str) -> None:
        self.id = aggregate_id
        self.version = 0
        self.exists = False
        self.created_at: datetime | None = None
        self.updated_at: datetime | None = None
        self.last_sequence = 0
        self.correlation_id = ""

    def apply(self, event: Event, sequence: int = 0) -> bool:
        """Fold one event in; False if it was already folded. An event the view cannot fold
        (its `mutate` fails) is seen, not folded: the version moves past it, nothing else
        changes, and a warning says so; no event stops a reader."""
        if event.originator_version <= self.version:
            return False
        self.version = event.originator_version
        self.updated_at = event.timestamp
        self.correlation_id = event.correlation_id
        self.last_sequence = max(self.last_sequence, sequence)
        before = dict(vars(self))  # `mutate` rebinds, so this restores the view exactly
        try:
            self.mutate(event)
        except Exception as e:
            vars(self).clear()
            vars(self).update(before)
            self.ignore(event, f"folding it failed: {type(e).__name__}: {e}")
        return True

    def mutate(self, event: Event) -> None:
        """Fold `event` into the state by rebinding attributes, never by changing a list,
        dict or struct in place (see `copy`)."""
        raise NotImplementedError

    def ignore(self, event: Event, why: str) -> None:
        """Leave the view as it is for an event that does not fit it, with a warning."""
        log.warning("event ignored: it does not fit its view", type=event.TYPE,
                    aggregate=self.id, version=event.originator_version,
                    sequence=self.last_sequence, why=why)

    def render(self) -> dict[str, Any] | None:
        """The object in its API shape, for a view that needs nothing else of the cluster to
        show it (`projections.rendering.render_view` renders the others); None here."""
        return None

    def copy(self) -> Self:
        """`copy.copy(self)`: a shallow copy that can be folded (`apply`) without touching
        this view, since `mutate` only rebinds attributes and never changes a list, dict or
        struct they hold in place."""
        return copy.copy(self)



def iso(at: datetime | None) -> str:
    """RFC 3339 to the second, as Kubernetes writes a timestamp; each second formatted once
    (a list of 10,000 VMs has 20,000 timestamps and a few hundred distinct seconds)."""
    if at is None:
        return ""
    if at.tzinfo is None:
        return at.strftime(_RFC3339)
    return _utc_second(math.floor(at.timestamp()))


_RFC3339: Final = "%Y-%m-%dT%H:%M:%SZ"


@functools.lru_cache(maxsize=4096)
def _utc_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime(_RFC3339)


def object_meta(view: View, meta: ObjectMeta, uid: str, generation: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": meta.name,
        "namespace": meta.namespace,
        "uid": uid,
        "resourceVersion": str(view.last_sequence),
        "creationTimestamp": iso(view.created_at),
    }
    if generation:
        out["generation"] = generation
    if meta.labels:
        out["labels"] = dict(meta.labels)
    if meta.annotations:
        out["annotations"] = dict(meta.annotations)
    return out
