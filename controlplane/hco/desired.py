"""What every operand should look like, and where an observed operand differs from it.

`drift` compares the fields HCO owns (`spec`, HCO's labels and annotations); anything else
on the observed object (status, extra labels, server-set metadata) is not HCO's and never drift.
A non-empty drift on an operand HCO did not just write is an out-of-band modification: the
controller reverts it and counts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.hco import jsonpatch
from controlplane.hco.operands import OPERANDS, ClusterInfo
from controlplane.hco.operands.base import JSON
from events.api.hco import HyperConverged


@dataclass(frozen=True)
class Desired:
    """Operand CRs by kind, jsonpatch applied where it could be, and the patches that failed."""

    objects: dict[str, JSON]
    failures: tuple[jsonpatch.PatchFailure, ...] = field(default=())


def desired_operands(hco: HyperConverged, *, cluster: ClusterInfo | None = None) -> Desired:
    """Derive every registered operand; a failed patch leaves that operand unpatched.

    Raises `InvalidSpec` only for what `validate_hco` already refuses (tuningPolicy).
    """
    cluster = cluster or ClusterInfo()
    objects: dict[str, JSON] = {}
    failures: list[jsonpatch.PatchFailure] = []
    annotations = hco.metadata.annotations
    for operand in OPERANDS:
        obj = operand.derive(hco, cluster)
        text = annotations.get(operand.jsonpatch_annotation)
        if text is not None:
            patched = jsonpatch.apply(obj, operand.jsonpatch_annotation, text)
            if isinstance(patched, jsonpatch.PatchFailure):
                failures.append(patched)
            else:
                obj = patched
        objects[operand.kind] = obj
    return Desired(objects=objects, failures=tuple(failures))


def drift(desired: JSON, actual: JSON) -> list[str]:
    """JSON pointers of the HCO-owned fields where `actual` differs from `desired`."""
    changed = _diff(desired.get("spec", {}), actual.get("spec", {}), "/spec")
    for part in ("labels", "annotations"):
        want: Mapping[str, str] = desired.get("metadata", {}).get(part, {})
        have: Mapping[str, str] = actual.get("metadata", {}).get(part, {})
        changed.extend(
            f"/metadata/{part}/{_escape(key)}"
            for key, value in want.items()
            if have.get(key) != value
        )
    return changed


def pending_write(desired: JSON, actual: JSON, *, out_of_band: bool) -> list[str] | None:
    """The drift HCO's write of `desired` over `actual` undoes, or None when HCO writes
    nothing. An out-of-band write is reverted only where it touched what HCO owns; HCO's own
    last write is replaced on any change of the derivation. The controller asks this to
    decide whether to write, the writer to decide on fresh state what the write is."""
    paths = drift(desired, actual)
    if paths or (not out_of_band and desired != actual):
        return paths
    return None


def _diff(want: Any, have: Any, path: str) -> list[str]:
    if isinstance(want, dict) and isinstance(have, dict):
        keys = list(want) + [key for key in have if key not in want]
        return [
            changed
            for key in keys
            for changed in _diff(want.get(key), have.get(key), f"{path}/{_escape(key)}")
        ]
    if isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        return [
            changed
            for index, (w, h) in enumerate(zip(want, have, strict=True))
            for changed in _diff(w, h, f"{path}/{index}")
        ]
    same = want == have and isinstance(want, bool) == isinstance(have, bool)
    return [] if same else [path]


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
