"""`patch` of any kind `apply` admits, decided by the control plane in one decision: the
object is read through the decision (so the write is guarded by the sequence read, and a
conflict decides the patch again on fresh state, as for every decision), rendered back to the
manifest its `apply` takes, patched (RFC 6902 `json` or RFC 7386 `merge`), and the result
decided by the kind's own `apply` handler within the same decision: its admission, its uid
and generation rules and its events, exactly.

A kind whose view keeps no manifest to patch (a VirtualMachineInstanceMigration: its view
keeps what the migration did, not its spec) is refused, naming why."""

from __future__ import annotations

import copy
import functools
from typing import Any, Final

import json_merge_patch
import jsonpatch
import jsonpointer
import msgspec

from controlplane.decision import HANDLERS, Decision, Handler, Rejected
from controlplane.objects.commands import generic_handler
from events.api.errors import InvalidSpec
from events.api.kinds import Kind, kind_named
from events.api.patch import PatchBody
from events.language.subjects import aggregate_id
from projections.kinds import fold_of
from projections.views import View

CONFLICT: Final = ("the object has been modified; please apply your changes to the latest "
                   "version and try again")
"""Kubernetes' words for a write whose resourceVersion is not the object's."""
_IDENTITY: Final = (("kind",), ("metadata", "name"), ("metadata", "namespace"))
"""What a patch may not change: which object it is."""


def patch_handler(kind: str, verb: str) -> Handler | None:
    """The `patch` handler of every declared kind with a manifest and an `apply` handler
    (its own or the generic one); None for any other verb or kind."""
    declared = kind_named(kind)
    if verb != "patch" or declared is None or declared.manifest is None:
        return None
    apply = HANDLERS.get((kind, "apply")) or generic_handler(kind, "apply")
    view_cls = fold_of(declared.token)
    if apply is None or view_cls is None:
        return None
    return functools.partial(patch_object, declared, view_cls, apply)


def patch_object(declared: Kind, view_cls: type[View], apply: Handler, d: Decision) -> None:
    body = d.body(PatchBody)
    cmd = d.command
    namespace = "" if declared.cluster_scoped else cmd.namespace
    found = d.load(aggregate_id(declared.token, namespace, cmd.name), view_cls)
    if not found.exists:
        raise Rejected(f'{declared.singular} "{cmd.name}" not found', "metadata.name")
    if body.resource_version and body.resource_version != str(found.state.last_sequence):
        raise Rejected(CONFLICT, "metadata.resourceVersion")
    current = manifest_of(declared, found.state)
    patched = patched_manifest(current, body)
    for path in _IDENTITY:
        if _at(patched, path) != _at(current, path):
            raise InvalidSpec(".".join(path), "a patch cannot change which object it is")
    d.deciding_apply(patched, apply)


def manifest_of(declared: Kind, view: View) -> dict[str, Any]:
    """The object as its kind's `apply` takes it, from what its view keeps: the whole object
    (HCO's operands), or its metadata with its spec (or, for a generic kind, its content)."""
    kept = vars(view)
    if isinstance(kept.get("object"), dict):
        return copy.deepcopy(kept["object"])
    if "metadata" not in kept or not ("spec" in kept or "content" in kept):
        raise Rejected(f"a {declared.kind} cannot be patched: the control plane keeps what "
                       "it did, not a spec to patch; delete it and create it again", "verb")
    manifest: dict[str, Any] = {"apiVersion": kept.get("api_version") or declared.api_version,
                                "kind": declared.kind,
                                "metadata": msgspec.to_builtins(kept["metadata"])}
    if "content" in kept:
        manifest.update(copy.deepcopy(kept["content"]))
    else:
        manifest["spec"] = msgspec.to_builtins(kept["spec"])
    return manifest


def patched_manifest(current: dict[str, Any], body: PatchBody) -> dict[str, Any]:
    """`current` with `body`'s patch applied, or a refusal naming the path that failed."""
    if body.type == "json":
        if not isinstance(body.patch, list):
            raise InvalidSpec("patch", "a json patch is a list of operations")
        result: Any = current
        for i, op in enumerate(body.patch):
            try:
                result = jsonpatch.JsonPatch([op]).apply(result)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                raise InvalidSpec(str(op.get("path", f"patch[{i}]")), str(e)) from None
    else:
        if not isinstance(body.patch, dict):
            raise InvalidSpec("patch", "a merge patch is an object")
        if not body.overwrite and (path := _replaced(current, body.patch)):
            raise InvalidSpec(path, "is already set; pass --overwrite to replace it")
        result = json_merge_patch.merge(copy.deepcopy(current), body.patch)
    if not isinstance(result, dict):
        raise InvalidSpec("patch", "the patched object is no object")
    return result


def _replaced(current: Any, patch: dict[str, Any], path: str = "") -> str:
    """The first path at which `patch` would replace a value set to another, or ''."""
    for key, value in patch.items():
        here = f"{path}.{key}" if path else key
        old = current.get(key) if isinstance(current, dict) else None
        if isinstance(value, dict):
            if found := _replaced(old, value, here):
                return found
        elif value is not None and old is not None and old != value:
            return here
    return ""


def _at(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc
