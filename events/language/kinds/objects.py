"""Events of any declared kind that has no events of its own: the object as it was applied,
and its deletion. A kind whose objects only need to be stored, listed and watched (its
declaration in `events.api` is all it has) lives on these.

| aggregate                    | events                         |
|------------------------------|--------------------------------|
| `<token>.<ns>.<name>`        | ObjectApplied / ObjectDeleted  |
"""

from __future__ import annotations

from typing import Any

from events.api.base import ObjectMeta
from events.language.codec import Event, event_type


@event_type("ObjectApplied")
class ObjectApplied(Event, frozen=True, kw_only=True):
    """Created or changed: `content` is the object's every top-level field but `apiVersion`,
    `kind`, `metadata` and `status` (its `spec`, say), as submitted; `uid` stays for the
    object's life, `generation` counts changes of the content."""

    uid: str
    metadata: ObjectMeta
    content: dict[str, Any]
    generation: int


@event_type("ObjectDeleted")
class ObjectDeleted(Event, frozen=True, kw_only=True):
    pass
