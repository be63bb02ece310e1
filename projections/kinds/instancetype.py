"""Read models of instancetypes, preferences and their ControllerRevisions, rendered as
KubeVirt (and `apps/v1`) show them."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from events.api.base import ObjectMeta
from events.api.instancetype import (
    CLUSTER_INSTANCETYPE,
    CLUSTER_KINDS,
    CLUSTER_PREFERENCE,
    SHOWN_API_VERSION,
    VirtualMachineInstancetypeSpec,
    VirtualMachinePreferenceSpec,
)
from events.api.vm import API_VERSION as VM_API_VERSION
from events.api.vm import VirtualMachineSpec
from events.language.codec import Event
from events.language.kinds.instancetype import (
    KIND_TOKENS,
    REVISION_KIND,
    REVISION_TOKEN,
    ControllerRevisionCreated,
    ControllerRevisionDeleted,
    VirtualMachineInstancetypeApplied,
    VirtualMachineInstancetypeDeleted,
    VirtualMachinePreferenceApplied,
    VirtualMachinePreferenceDeleted,
)
from projections.views import View, object_meta

REVISION_API_VERSION: Final = "apps/v1"
"""The kinds the read side serves from here."""


class InstancetypeView(View, tokens=KIND_TOKENS.values()):
    """Any of the four kinds: the spec is an instancetype's or a preference's."""

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.kind = ""
        self.api_version = ""
        self.uid = ""
        self.metadata = ObjectMeta()
        self.spec: VirtualMachineInstancetypeSpec | VirtualMachinePreferenceSpec | None = None
        self.generation = 0

    def mutate(self, event: Event) -> None:
        match event:
            case VirtualMachineInstancetypeApplied(
                    kind=kind, api_version=version, uid=uid, metadata=meta, spec=spec,
                    generation=gen) | VirtualMachinePreferenceApplied(
                    kind=kind, api_version=version, uid=uid, metadata=meta, spec=spec,
                    generation=gen):
                if not self.exists:
                    self.created_at = event.timestamp
                self.exists, self.kind, self.api_version, self.uid = True, kind, version, uid
                self.metadata, self.spec, self.generation = meta, spec, gen
            case VirtualMachineInstancetypeDeleted() | VirtualMachinePreferenceDeleted():
                self.exists = False

    def api_object(self) -> dict[str, Any]:
        """The object as a revision captures it: KubeVirt's shape, without labels and
        annotations (`CreateControllerRevision` strips them)."""
        meta: dict[str, Any] = {"name": self.metadata.name, "uid": self.uid,
                                "generation": self.generation}
        if self.kind not in CLUSTER_KINDS:
            meta["namespace"] = self.metadata.namespace
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta,
                "spec": msgspec.to_builtins(self.spec)}

    def render(self) -> dict[str, Any]:
        return render_instancetype(self)


class ControllerRevisionView(View, tokens=(REVISION_TOKEN,)):
    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.metadata = ObjectMeta()
        self.owner = ""
        self.owner_uid = ""
        self.data: dict[str, Any] = {}

    def mutate(self, event: Event) -> None:
        match event:
            case ControllerRevisionCreated(metadata=meta, owner=owner, owner_uid=owner_uid,
                                           data=data):
                self.exists, self.created_at = True, event.timestamp
                self.metadata, self.owner, self.owner_uid, self.data = meta, owner, owner_uid, data
            case ControllerRevisionDeleted():
                self.exists = False

    def render(self) -> dict[str, Any]:
        return render_revision(self)


def render_instancetype(view: InstancetypeView) -> dict[str, Any]:
    """In the version KubeVirt serves first, whichever version it was applied in."""
    meta = object_meta(view, view.metadata, view.uid, view.generation)
    if view.kind in CLUSTER_KINDS:
        del meta["namespace"]
    return {"apiVersion": SHOWN_API_VERSION, "kind": view.kind, "metadata": meta,
            "spec": msgspec.to_builtins(view.spec)}


def render_revision(view: ControllerRevisionView) -> dict[str, Any]:
    meta = object_meta(view, view.metadata, "")
    del meta["uid"]
    meta["ownerReferences"] = [{"apiVersion": VM_API_VERSION, "kind": "VirtualMachine",
                                "name": view.owner, "uid": view.owner_uid,
                                "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": REVISION_API_VERSION, "kind": REVISION_KIND, "metadata": meta,
            "data": view.data, "revision": 0}


def revision_refs(spec: VirtualMachineSpec) -> dict[str, Any]:
    """`status.instancetypeRef` / `status.preferenceRef` as current KubeVirt shows them,
    once the VM is pinned to a revision (the kind as the matcher names it, or the cluster
    kind it defaults to)."""
    out: dict[str, Any] = {}
    for field, matcher, default in (("instancetypeRef", spec.instancetype, CLUSTER_INSTANCETYPE),
                                    ("preferenceRef", spec.preference, CLUSTER_PREFERENCE)):
        if matcher is not None and matcher.revision_name:
            out[field] = {"kind": matcher.kind or default, "name": matcher.name,
                          "controllerRevisionRef": {"name": matcher.revision_name}}
    return out
