"""Objects of any declared kind that has no fold of its own: kept as applied, rendered as
submitted with the metadata the API server adds (uid, resourceVersion, generation,
creationTimestamp)."""

from __future__ import annotations

import copy
from typing import Any

from events.api.base import ObjectMeta
from events.api.kinds import of_token
from events.language.codec import Event
from events.language.kinds.objects import ObjectApplied, ObjectDeleted
from events.language.subjects import split_aggregate_id
from projections.views import View, object_meta


class ObjectView(View):
    """Folds `ObjectApplied` and `ObjectDeleted` for every token `projections.kinds` gives
    it: each declared kind's whose module folds none."""

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.uid = ""
        self.metadata = ObjectMeta()
        self.content: dict[str, Any] = {}
        self.generation = 0

    def mutate(self, event: Event) -> None:
        match event:
            case ObjectApplied(uid=uid, metadata=meta, content=content, generation=generation):
                if not self.exists:
                    self.created_at = event.timestamp
                self.exists, self.uid, self.metadata = True, uid, meta
                self.content, self.generation = content, generation
            case ObjectDeleted():
                self.exists = False

    def render(self) -> dict[str, Any]:
        return render_object(self)


def render_object(view: ObjectView) -> dict[str, Any]:
    """The object in its kind's shown version, as it was applied."""
    declared = of_token(split_aggregate_id(view.id)[0])
    meta = object_meta(view, view.metadata, view.uid, view.generation)
    if declared is None or not declared.namespaced:
        del meta["namespace"]
    return {"apiVersion": declared.api_version if declared else "", "kind":
            declared.kind if declared else "", "metadata": meta,
            **copy.deepcopy(view.content)}  # an answer is the asker's to change (redaction)
