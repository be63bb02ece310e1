"""The four jsonpatch annotations: unsupported, user-owned RFC 6902 edits of an operand CR.

A patch is applied to the derived operand, so HCO stops reverting what it sets. A patch that
does not parse, does not apply, or reaches outside `/spec` is reported as a `PatchFailure`
and the derived operand is left as it was. While any of the annotations is present the
configuration is tainted (`TaintedConfiguration`, `kubevirt_hco_unsafe_modifications`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import jsonpatch
import jsonpointer

from controlplane.hco.operands import OPERANDS
from controlplane.hco.operands.base import JSON

ANNOTATIONS: tuple[str, ...] = tuple(op.jsonpatch_annotation for op in OPERANDS)


@dataclass(frozen=True)
class PatchFailure:
    """Why an annotation's patch was not applied, in words a person can act on."""

    annotation: str
    reason: str


def parse(annotation: str, text: str) -> jsonpatch.JsonPatch | PatchFailure:
    """An annotation's patch, or why it is not one."""
    try:
        operations = json.loads(text)
    except json.JSONDecodeError as exc:
        return PatchFailure(annotation, f"not valid JSON: {exc.msg}")
    if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
        return PatchFailure(annotation, "must be a JSON array of RFC 6902 operation objects")
    for op in operations:
        path = op.get("path")
        if not isinstance(path, str) or not (path == "/spec" or path.startswith("/spec/")):
            return PatchFailure(annotation, f"operation path {path!r} is outside /spec")
    return jsonpatch.JsonPatch(operations)


def apply(obj: JSON, annotation: str, text: str) -> JSON | PatchFailure:
    """`obj` with the patch applied (a new object), or why it could not be."""
    patch = parse(annotation, text)
    if isinstance(patch, PatchFailure):
        return patch
    try:
        patched: JSON = patch.apply(obj)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        return PatchFailure(annotation, f"does not apply: {exc}")
    return patched


def present(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The jsonpatch annotations set on the HyperConverged, in registry order."""
    return tuple(name for name in ANNOTATIONS if name in annotations)


def unsafe_modification_counts(annotations: Mapping[str, str]) -> dict[str, int]:
    """Operations per present annotation, as `kubevirt_hco_unsafe_modifications` counts them."""
    counts: dict[str, int] = {}
    for name in present(annotations):
        patch = parse(name, annotations[name])
        counts[name] = 0 if isinstance(patch, PatchFailure) else len(patch.patch)
    return counts
