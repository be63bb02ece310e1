"""Commands of any declared kind that has neither a fold nor handlers of its own (its
declaration in `events.api` is all it has): `apply` keeps the object as submitted and
admitted (`ObjectApplied`), `delete` deletes it (`ObjectDeleted`), each as the API server
has it: a new object gets a uid and generation 1, a change of its content counts a
generation, an apply that changes nothing appends nothing."""

from __future__ import annotations

import functools
from typing import Final

import msgspec

from controlplane.decision import Decision, Handler
from events.api.base import ApiStruct, ObjectMeta
from events.api.errors import InvalidSpec
from events.api.kinds import Kind, kind_named
from events.language.ids import random_uuid
from events.language.kinds.objects import ObjectApplied, ObjectDeleted
from events.language.subjects import aggregate_id
from projections.kinds import fold_of
from projections.kinds.objects import ObjectView

_NOT_CONTENT = frozenset({"apiVersion", "kind", "metadata", "status"})


def apply_object(declared: Kind, manifest: type[ApiStruct], d: Decision) -> None:
    new = d.submitted(manifest)
    meta = getattr(new, "metadata", None)
    if not isinstance(meta, ObjectMeta):
        raise InvalidSpec("metadata", f"a {declared.kind} needs metadata")
    content = {key: value for key, value in msgspec.to_builtins(new).items()
               if key not in _NOT_CONTENT}
    found = d.load(aggregate_id(declared.token,
                                "" if declared.cluster_scoped else meta.namespace, meta.name),
                   ObjectView)
    old = found.state
    if found.exists:
        if (old.content, old.metadata.labels, old.metadata.annotations) == (
                content, meta.labels, meta.annotations):
            return
        uid, generation = old.uid, old.generation + (old.content != content)
    else:
        uid, generation = random_uuid(), 1
    d.trigger(found, ObjectApplied, uid=uid, metadata=meta, content=content,
              generation=generation)


def delete_object(declared: Kind, _: type[ApiStruct], d: Decision) -> None:
    d.trigger(d.existing(declared.token, ObjectView, declared.kind.lower()), ObjectDeleted)


_VERBS: Final = {"apply": apply_object, "delete": delete_object}


def generic_handler(kind: str, verb: str) -> Handler | None:
    """The handler of `verb` for a declared kind that `ObjectView` folds and `apply`
    admits; None for any other."""
    declared = kind_named(kind)
    decide = _VERBS.get(verb)
    if declared is None or declared.manifest is None or decide is None \
            or fold_of(declared.token) is not ObjectView:
        return None
    return functools.partial(decide, declared, declared.manifest)
